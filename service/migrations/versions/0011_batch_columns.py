"""A batch's documents are parsed once. When the service validates a host's batch it also lays its
documents out as columns (eroica.engine.column_chunks) and keeps them beside the batch, one row per
window the batch feeds, until that window's diagnosis is stored: the diagnosis merges the columns
instead of parsing every document again. A window diagnosed again later (late ranks) parses the
batches whose columns are gone.

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batch_columns",
        sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk", name="fk_batch_columns_window_pk"),
                  nullable=False),
        sa.Column("batch_pk", sa.Integer, sa.ForeignKey("batches.pk", name="fk_batch_columns_batch_pk"),
                  nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("window_pk", "batch_pk", name="pk_batch_columns"),
    )


def downgrade() -> None:
    op.drop_table("batch_columns")
