"""Alerts sent once across replicas, and never a change lost while one is being sent: each issue's
alert has a version (bumped whenever it must be sent again) and a claim (the replica sending it,
until when). And each window counts the diagnoses stored for it (a window diagnosed twice shows).

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("windows") as b:
        b.add_column(sa.Column("diagnoses_stored", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("issues") as b:
        b.add_column(sa.Column("alert_version", sa.Integer, nullable=False, server_default="0"))
        b.add_column(sa.Column("alert_claimed_by", sa.String(64)))
        b.add_column(sa.Column("alert_claim_until", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("issues") as b:
        for c in ("alert_claim_until", "alert_claimed_by", "alert_version"):
            b.drop_column(c)
    with op.batch_alter_table("windows") as b:
        b.drop_column("diagnoses_stored")
