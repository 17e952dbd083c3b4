"""Issues carry their alert's delivery state (one alert per issue, updated, then resolved).

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("issues") as b:
        b.add_column(sa.Column("alert_dirty", sa.Boolean, nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("alert_state", sa.String(16), nullable=False, server_default="none"))
        b.add_column(sa.Column("alert_attempts", sa.Integer, nullable=False, server_default="0"))
        b.add_column(sa.Column("alert_error", sa.Text))
        b.add_column(sa.Column("alert_sent_at", sa.Float))
        b.add_column(sa.Column("alert_next_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("issues") as b:
        for c in ("alert_next_at", "alert_sent_at", "alert_error", "alert_attempts", "alert_state", "alert_dirty"):
            b.drop_column(c)
