"""The kept raw traces of a job's windows (a suspect's and a healthy peer's), linked from its page.

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "raw_traces",
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("window_id", sa.String(64), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("trace_bytes", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255)),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("raw_traces")
