"""Issues: a finding's lifecycle across windows (one per job, root cause and ranks).

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "issues",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("root_cause", sa.String(64), nullable=False),
        sa.Column("category", sa.String(16), nullable=False),
        sa.Column("ranks", sa.String(512), nullable=False),
        sa.Column("hosts", sa.JSON, nullable=False),
        sa.Column("function", sa.Text),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("windows_total", sa.Integer, nullable=False),
        sa.Column("top_confidence", sa.Float, nullable=False),
        sa.Column("last_window_pk", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("history", sa.JSON, nullable=False),
        sa.Column("link_url", sa.Text),
        sa.Column("link_kind", sa.String(32)),
        sa.UniqueConstraint("job_id", "root_cause", "ranks", name="uq_issues_job_cause_ranks"),
    )
    op.create_index("ix_issues_state", "issues", ["state"])


def downgrade() -> None:
    op.drop_table("issues")
