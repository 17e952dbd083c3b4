"""Each diagnosis keeps its window's history summary (eroica.schema.diagnosis WindowHistory: the
job's step time, the ranks' config deviations, what was found), so that a later window of the job
reads the summaries of the earlier ones instead of their documents. Windows diagnosed before this
revision have none and are not history for later ones.

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("diagnoses") as b:
        b.add_column(sa.Column("history", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("diagnoses") as b:
        b.drop_column("history")
