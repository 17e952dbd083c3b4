"""The first schema: jobs, windows, documents, diagnoses, findings, step series.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("world_size", sa.Integer, nullable=False),
        sa.Column("hosts", sa.JSON, nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "windows",
        sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id", name="fk_windows_job_id"), nullable=False),
        sa.Column("window_id", sa.String(64), nullable=False),
        sa.Column("world_size", sa.Integer, nullable=False),
        sa.Column("start_step", sa.Integer, nullable=False),
        sa.Column("end_step", sa.Integer, nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("ranks_reported", sa.Integer, nullable=False),
        sa.Column("first_doc_at", sa.Float, nullable=False),
        sa.Column("last_doc_at", sa.Float, nullable=False),
        sa.Column("window_closed_at", sa.Float),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("lease_until", sa.Float),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("diagnosed_at", sa.Float),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("job_id", "window_id", name="uq_windows_job_window"),
    )
    op.create_index("ix_windows_status", "windows", ["status"])
    op.create_table(
        "documents",
        sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk", name="fk_documents_window_pk"),
                  primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    op.create_table(
        "diagnoses",
        sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk", name="fk_diagnoses_window_pk"),
                  primary_key=True),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("healthy", sa.Boolean, nullable=False),
        sa.Column("diagnosable", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk", name="fk_findings_window_pk"), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("root_cause", sa.String(64), nullable=False),
        sa.Column("category", sa.String(16), nullable=False),
        sa.Column("ranks", sa.JSON, nullable=False),
        sa.Column("hosts", sa.JSON, nullable=False),
        sa.Column("function", sa.Text),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("rule_ids", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_findings_window_pk", "findings", ["window_pk"])
    op.create_index("ix_findings_job_id", "findings", ["job_id"])
    op.create_index("ix_findings_root_cause", "findings", ["root_cause"])
    op.create_table(
        "step_series",
        sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id", name="fk_step_series_job_id"), primary_key=True),
        sa.Column("first_step", sa.Integer, primary_key=True),
        sa.Column("last_step", sa.Integer, nullable=False),
        sa.Column("median_seconds", sa.Float, nullable=False),
        sa.Column("p90_seconds", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for t in ("step_series", "findings", "diagnoses", "documents", "windows", "jobs"):
        op.drop_table(t)
