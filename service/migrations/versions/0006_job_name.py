"""A job's name, shared by its runs (a restart is a new run with the same name), the runs an issue
has been followed through, the devices (host/device) its findings named, and when a run ended.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("name", sa.String(128)))
        b.create_index("ix_jobs_name", ["name"])
        b.add_column(sa.Column("ended_at", sa.Float))
        b.add_column(sa.Column("ended_by", sa.String(16)))
    op.execute("UPDATE jobs SET name = id WHERE name IS NULL")
    with op.batch_alter_table("issues") as b:
        b.add_column(sa.Column("runs", sa.JSON))
        b.add_column(sa.Column("devices", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("issues") as b:
        b.drop_column("devices")
        b.drop_column("runs")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("ended_by")
        b.drop_column("ended_at")
        b.drop_index("ix_jobs_name")
        b.drop_column("name")
