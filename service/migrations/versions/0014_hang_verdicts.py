"""Each job's hang verdict, made by the diagnosis worker (not the API thread) once per change of its
snapshots, stored once and served from here.

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hang_verdicts",
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),         # bumped by every snapshot
        sa.Column("done_version", sa.Integer, nullable=False),    # the snapshots' version the verdict is of
        sa.Column("claimed_by", sa.String(255)),
        sa.Column("claimed_until", sa.Float),
        sa.Column("state", sa.String(16)),                        # suspected, confirmed, resolved
        sa.Column("body", sa.JSON),                               # the HangFinding
        sa.Column("first_at", sa.Float, nullable=False),          # the first snapshot's arrival
        sa.Column("changed_at", sa.Float, nullable=False),        # the newest snapshot's arrival
        sa.Column("at", sa.Float),                                # the verdict's
    )


def downgrade() -> None:
    op.drop_table("hang_verdicts")
