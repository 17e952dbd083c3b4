"""Alembic environment: the service hands its connection in (`config.attributes["connection"]`)."""

from alembic import context

from eroica.service.db import meta

conn = context.config.attributes["connection"]
context.configure(connection=conn, target_metadata=meta, render_as_batch=True)
context.run_migrations()
