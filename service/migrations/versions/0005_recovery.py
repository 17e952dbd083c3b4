"""Issues carry what their recovery measured (reference step times, accelerator-hours given back).

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("issues") as b:
        b.add_column(sa.Column("recovery", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("issues") as b:
        b.drop_column("recovery")
