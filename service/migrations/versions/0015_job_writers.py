"""A job is bound to the scope of the writer that created it (a job token's or a watched root's glob). A writer
of another scope may not write it, even when its glob matches (the service's token may write any job).

Revision ID: 0015
Revises: 0014
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_writers",
        sa.Column("job_id", sa.String(128), primary_key=True),     # claimed before the job's first row is made
        sa.Column("writer", sa.String(300), nullable=False),       # scope:<the token's or the root's glob>
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_writers")
