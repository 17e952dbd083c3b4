"""Fleet-rate ingestion. A batch of documents (a host's ranks, one per line) is stored once, as it
came (gzip'd), in `batches`; its documents' rows point at it (`batch_pk`, `line`) instead of each
holding its own compressed copy (`body`, still used for a document uploaded alone).

And a run's hosts in a table of their own (one row per host) instead of a JSON list in the run's row:
a 12,500-host job no longer rewrites a list of every host each time a new host's first document
arrives (O(hosts^2) bytes written for one window), and a host's first document takes no lock on
the run's row. The lists are carried over; `jobs.hosts` is left in place, unused.

Revision ID: 0010
Revises: 0009
"""
import json

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_hosts",
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id", name="fk_job_hosts_job_id"),
                  nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "host", name="pk_job_hosts"),
    )
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, hosts, first_seen FROM jobs")).all()
    table = sa.table("job_hosts", sa.column("job_id"), sa.column("host"), sa.column("first_seen"))
    for job_id, hosts, first_seen in rows:
        hosts = json.loads(hosts) if isinstance(hosts, str) else (hosts or [])
        if hosts:
            op.bulk_insert(table, [{"job_id": job_id, "host": h, "first_seen": first_seen} for h in hosts])
    op.create_table(
        "batches",
        sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("documents") as b:
        b.alter_column("body", existing_type=sa.LargeBinary, nullable=True)
        b.add_column(sa.Column("batch_pk", sa.Integer, sa.ForeignKey("batches.pk", name="fk_documents_batch_pk")))
        b.add_column(sa.Column("line", sa.Integer))
    # jobs.hosts stays (SQLite would rebuild the table other tables point at to drop it); it is no
    # longer written or read


def downgrade() -> None:
    op.drop_table("job_hosts")
    with op.batch_alter_table("documents") as b:
        b.drop_column("line")
        b.drop_column("batch_pk")
    op.drop_table("batches")
