"""A stored finding says where its ranks run (`devices`, "node07/cuda:3") and whether it is a host's
problem or its ranks' (`scope`), as the diagnosis does. Findings stored before this revision have
neither (read as none, and "rank").

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings") as b:
        b.add_column(sa.Column("devices", sa.JSON))
        b.add_column(sa.Column("scope", sa.String(8)))


def downgrade() -> None:
    with op.batch_alter_table("findings") as b:
        b.drop_column("scope")
        b.drop_column("devices")
