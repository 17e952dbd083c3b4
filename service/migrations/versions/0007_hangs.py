"""Each rank's newest hang snapshot, so a job that stopped stepping is localized while it waits.

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hang_snapshots",
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("wall_time", sa.Float, nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hang_snapshots")
