"""Windows keep when they opened (the first rank's clock): detector to diagnosis is measurable.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("windows") as b:
        b.add_column(sa.Column("window_opened_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("windows") as b:
        b.drop_column("window_opened_at")
