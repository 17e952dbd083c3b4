"""The service's database: SQLAlchemy Core tables, the engine (SQLite by default, PostgreSQL for a
fleet), and the schema's versioned migrations (Alembic, `service/migrations/`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "ck": "ck_%(table_name)s_%(constraint_name)s", "fk": "fk_%(table_name)s_%(column_0_name)s",
          "pk": "pk_%(table_name)s"}
meta = sa.MetaData(naming_convention=NAMING)

jobs = sa.Table(
    "jobs", meta,
    sa.Column("id", sa.String(128), primary_key=True),          # one run: the job's name and run directory
    sa.Column("name", sa.String(128), index=True),               # the job's name, the same for its restarts (0006)
    sa.Column("ended_at", sa.Float),                             # its rank 0 said so, or it fell silent (0006)
    sa.Column("ended_by", sa.String(16)),                        # "job" or "silence"
    sa.Column("world_size", sa.Integer, nullable=False),
    sa.Column("hosts", sa.JSON, nullable=False),                 # unused since 0010: job_hosts
    sa.Column("first_seen", sa.Float, nullable=False),           # unix seconds
    sa.Column("last_seen", sa.Float, nullable=False),
)

job_hosts = sa.Table(                                            # a run's hosts, one row each (0010)
    "job_hosts", meta,
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("host", sa.String(255), primary_key=True),
    sa.Column("first_seen", sa.Float, nullable=False),
)


def confident_counts(c: sa.Connection, job_ids: list[str] | None = None) -> dict[str, int]:
    """Each job's findings at 0.5 or more (of `job_ids`; of every job when None)."""
    q = sa.select(findings.c.job_id, sa.func.count()).where(findings.c.confidence >= 0.5)
    if job_ids is not None:
        q = q.where(findings.c.job_id.in_(job_ids))
    return {j: int(n) for j, n in c.execute(q.group_by(findings.c.job_id)).all()}


def host_counts(c: sa.Connection, job_ids: list[str]) -> dict[str, int]:
    got: dict[str, int] = {}
    for i in range(0, len(job_ids), 500):
        got.update((j, n) for j, n in c.execute(sa.select(job_hosts.c.job_id, sa.func.count()).where(
            job_hosts.c.job_id.in_(job_ids[i:i + 500])).group_by(job_hosts.c.job_id)))
    return {j: int(got.get(j, 0)) for j in job_ids}


def hosts_of(c: sa.Connection, job_ids: list[str]) -> dict[str, list[str]]:
    """The hosts of each run, sorted (an empty list for a run with none)."""
    out: dict[str, list[str]] = {j: [] for j in job_ids}
    for i in range(0, len(job_ids), 500):
        for j, h in c.execute(sa.select(job_hosts.c.job_id, job_hosts.c.host)
                              .where(job_hosts.c.job_id.in_(job_ids[i:i + 500])).order_by(job_hosts.c.host)):
            out[j].append(h)
    return out

windows = sa.Table(
    "windows", meta,
    sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("window_id", sa.String(64), nullable=False),
    sa.Column("world_size", sa.Integer, nullable=False),
    sa.Column("start_step", sa.Integer, nullable=False),
    sa.Column("end_step", sa.Integer, nullable=False),
    sa.Column("trigger", sa.String(16), nullable=False),
    # collecting -> ready (all ranks, or the grace period passed) -> claimed -> done | failed
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("ranks_reported", sa.Integer, nullable=False, default=0),
    sa.Column("first_doc_at", sa.Float, nullable=False),
    sa.Column("last_doc_at", sa.Float, nullable=False),
    sa.Column("window_opened_at", sa.Float),     # the earliest open among the ranks (revision 0002)
    sa.Column("window_closed_at", sa.Float),     # the latest close among the ranks (their clocks, unix seconds)
    sa.Column("claimed_by", sa.String(64)),
    sa.Column("lease_until", sa.Float),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("diagnoses_stored", sa.Integer, nullable=False, server_default="0"),   # ever (revision 0008)
    sa.Column("diagnosed_at", sa.Float),
    sa.Column("error", sa.Text),
    sa.UniqueConstraint("job_id", "window_id", name="uq_windows_job_window"),
)

batches = sa.Table(                     # many documents as they came, one per line, gzip'd (0010)
    "batches", meta,
    sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("received_at", sa.Float, nullable=False),
)

batch_columns = sa.Table(               # a batch's documents of one window as columns, until it is diagnosed (0011)
    "batch_columns", meta,
    sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk"), primary_key=True),
    sa.Column("batch_pk", sa.Integer, sa.ForeignKey("batches.pk"), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),            # eroica.engine.column_chunks
)

documents = sa.Table(
    "documents", meta,
    sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk"), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("body", sa.LargeBinary),             # the document's JSON, gzip'd, when it came alone
    sa.Column("batch_pk", sa.Integer, sa.ForeignKey("batches.pk")),   # or its batch and line there (0010)
    sa.Column("line", sa.Integer),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("received_at", sa.Float, nullable=False),
)

diagnoses = sa.Table(
    "diagnoses", meta,
    sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk"), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),           # eroica.diagnosis/v1 of this window, gzip'd
    sa.Column("healthy", sa.Boolean, nullable=False),
    sa.Column("diagnosable", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("history", sa.Text),       # the window's WindowHistory JSON: what later windows read (0009)
)

findings = sa.Table(
    "findings", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("window_pk", sa.Integer, sa.ForeignKey("windows.pk"), nullable=False, index=True),
    sa.Column("job_id", sa.String(128), nullable=False, index=True),
    sa.Column("root_cause", sa.String(64), nullable=False, index=True),
    sa.Column("category", sa.String(16), nullable=False),
    sa.Column("ranks", sa.JSON, nullable=False),
    sa.Column("hosts", sa.JSON, nullable=False),
    sa.Column("function", sa.Text),
    sa.Column("confidence", sa.Float, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("rule_ids", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("devices", sa.JSON),            # where the ranks run, "host/device" (revision 0012; None before)
    sa.Column("scope", sa.String(8)),         # "host" or "rank" (revision 0012; None before: "rank")
)

issues = sa.Table(   # a finding's lifecycle: one per job, root cause and ranks, across windows (revision 0003)
    "issues", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("root_cause", sa.String(64), nullable=False),
    sa.Column("category", sa.String(16), nullable=False),
    sa.Column("ranks", sa.String(512), nullable=False),            # "1,3": part of its identity
    sa.Column("hosts", sa.JSON, nullable=False),
    sa.Column("function", sa.Text),
    sa.Column("first_seen", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("windows_total", sa.Integer, nullable=False),
    sa.Column("top_confidence", sa.Float, nullable=False),
    sa.Column("last_window_pk", sa.Integer, nullable=False),
    # open -> acknowledged -> linked -> recovered | not_recovered | false_positive
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("history", sa.JSON, nullable=False),                 # [{state, who, at, why|url}]
    sa.Column("link_url", sa.Text),
    sa.Column("link_kind", sa.String(32)),                         # ticket, change_request, commit, config
    # its alert (revision 0004): dirty when it must be (re)sent; none, delivered or failed
    sa.Column("alert_dirty", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("alert_state", sa.String(16), nullable=False, server_default="none"),
    sa.Column("alert_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("alert_error", sa.Text),
    sa.Column("alert_sent_at", sa.Float),
    sa.Column("alert_next_at", sa.Float),
    # bumped whenever the alert must be (re)sent; the replica sending it holds a claim (revision 0008)
    sa.Column("alert_version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("alert_claimed_by", sa.String(64)),
    sa.Column("alert_claim_until", sa.Float),
    sa.Column("recovery", sa.JSON),            # what the job's step series says since (revision 0005)
    sa.Column("runs", sa.JSON),                # the runs of the job it was followed through, oldest first (0006)
    sa.Column("devices", sa.JSON),             # "host/device" of its ranks, e.g. "node-7/cuda:3" (0006)
    sa.UniqueConstraint("job_id", "root_cause", "ranks", name="uq_issues_job_cause_ranks"),
)

steps = sa.Table(   # the always-on step-time series: one row per summary a rank sends every N steps
    "step_series", meta,
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("first_step", sa.Integer, primary_key=True),
    sa.Column("last_step", sa.Integer, nullable=False),
    sa.Column("median_seconds", sa.Float, nullable=False),
    sa.Column("p90_seconds", sa.Float, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)

hangs = sa.Table(   # each rank's newest hang snapshot (the watchdog's; revision 0007)
    "hang_snapshots", meta,
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("wall_time", sa.Float, nullable=False),
    sa.Column("body", sa.JSON, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)

hang_verdicts = sa.Table(   # each job's hang verdict, made by the diagnosis worker (revision 0014)
    "hang_verdicts", meta,
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("done_version", sa.Integer, nullable=False),
    sa.Column("claimed_by", sa.String(255)),
    sa.Column("claimed_until", sa.Float),
    sa.Column("state", sa.String(16)),
    sa.Column("body", sa.JSON),
    sa.Column("first_at", sa.Float, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
    sa.Column("at", sa.Float),
)

job_writers = sa.Table(    # the writer that created each job, other than the service's token (revision 0015)
    "job_writers", meta,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("writer", sa.String(300), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)

raw_traces = sa.Table(   # the kept raw traces of a job's windows, its newest few (revision 0013)
    "raw_traces", meta,
    sa.Column("job_id", sa.String(128), sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("window_id", sa.String(64), primary_key=True),
    sa.Column("rank", sa.Integer, primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),            # the Chrome trace's JSON, gzip'd
    sa.Column("trace_bytes", sa.Integer, nullable=False),         # its size before gzip
    sa.Column("host", sa.String(255)),
    sa.Column("at", sa.Float, nullable=False),
)

def traces_of(c: sa.Connection, job_id: str) -> dict[str, list[dict[str, Any]]]:
    """A job's kept traces by window: rank, host and size, ranks in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in c.execute(sa.select(raw_traces.c.window_id, raw_traces.c.rank, raw_traces.c.host,
                                   raw_traces.c.trace_bytes).where(raw_traces.c.job_id == job_id)
                         .order_by(raw_traces.c.window_id, raw_traces.c.rank)).mappings():
        out.setdefault(row["window_id"], []).append(
            {"rank": row["rank"], "host": row["host"], "trace_bytes": row["trace_bytes"],
             "url": f"/v1/jobs/{job_id}/traces/{row['window_id']}/{row['rank']}"})
    return out


MIGRATIONS = Path(__file__).parent / "migrations"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None      # pysqlite's implicit BEGIN off: we emit BEGIN IMMEDIATE ourselves
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")     # readers never block the one writer
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # a write takes the write lock at once (no upgrade deadlocks); a read (`reading`) takes none and,
    # in WAL mode, never waits for a writer
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("eroica_read") else "BEGIN IMMEDIATE")


def reading(eng: sa.Engine) -> sa.Connection:
    """A connection for reads only: on SQLite its transactions take no write lock, so a read is never
    queued behind a writer (nor behind a writer's busy wait). Writes go through `writing(eng)`: on
    SQLite a write through this connection could meet SQLITE_BUSY instead of waiting its turn."""
    return eng.execution_options(eroica_read=True).connect()


class _Writers:
    """This process's turn at SQLite's one write lock: a lock among its threads and, across the
    processes of a replica (`serve --http-processes`), an flock on a file beside the database. SQLite's
    own busy handler puts a waiting writer to sleep for up to 100 ms a try, so under many concurrent
    uploads its lock sat free while the writers slept; these hand it on the moment the holder commits."""

    def __init__(self, db_path: str | None) -> None:
        self.lock = threading.RLock()
        self.depth = 0
        self.fd = os.open(db_path + ".writer-lock", os.O_RDWR | os.O_CREAT, 0o600) if db_path else None

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self.lock:
            self.depth += 1
            try:
                if self.depth == 1 and self.fd is not None:
                    fcntl.flock(self.fd, fcntl.LOCK_EX)
                yield
            finally:
                if self.depth == 1 and self.fd is not None:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                self.depth -= 1


_WRITERS: weakref.WeakKeyDictionary[sa.Engine, _Writers] = weakref.WeakKeyDictionary()
_WRITERS_LOCK = threading.Lock()


@contextlib.contextmanager
def writing(eng: sa.Engine) -> Iterator[sa.Connection]:
    """A write transaction: `eng.begin()`, on SQLite in this process's turn (`_Writers`)."""
    if eng.dialect.name != "sqlite":
        with eng.begin() as c:
            yield c
        return
    with _WRITERS_LOCK:
        w = _WRITERS.get(eng)
        if w is None:
            path = eng.url.database
            w = _WRITERS[eng] = _Writers(path if path and path != ":memory:" else None)
            if w.fd is not None:
                weakref.finalize(eng, os.close, w.fd)
    with w.turn(), eng.begin() as c:
        yield c


def make_engine(url: str) -> sa.Engine:
    """An engine for `url` (sqlite:///PATH or postgresql+psycopg://...), configured for the service."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        eng = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        sa.event.listen(eng, "connect", _sqlite_pragmas)
        sa.event.listen(eng, "begin", _sqlite_begin)
        return eng
    return sa.create_engine(url, pool_pre_ping=True)


MIGRATION_LOCK = 0x65726F696361      # "eroica": PostgreSQL's advisory lock key for schema upgrades


def migrate(eng: sa.Engine) -> str | None:
    """Bring the schema to the newest revision in place (a new database gets every revision). On
    PostgreSQL, replicas starting together take turns (an advisory lock held until the upgrade's
    transaction ends): the first upgrades, the others find the schema at head. SQLite's writers are
    serialized by the database itself. The revision it found (None: an empty database)."""
    from alembic import command  # only here: a diagnosis worker reading the store needs none of it
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with writing(eng) as conn:
        if eng.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        found = MigrationContext.configure(conn).get_current_revision()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return found


def revision(eng: sa.Engine) -> str | None:
    with eng.connect() as conn:
        try:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        except sa.exc.DBAPIError:
            return None
