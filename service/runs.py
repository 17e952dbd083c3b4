"""A run's row, made and kept safely when many documents of it arrive at once, on any replica.

A run (`jobs`) is created by whichever of its documents, step summaries or hang snapshots arrives
first: `INSERT ... ON CONFLICT DO NOTHING` then the row read back locked (`FOR UPDATE` on
PostgreSQL; SQLite's writers are serialized by `BEGIN IMMEDIATE`), so simultaneous first documents
neither fail on the primary key nor lose a host (each host is a row of `job_hosts`, inserted the
same way; a wide window's documents take no lock on the run's row). A run's job name is fixed by
the first one that names it: a later different name is refused, so one token cannot move a run into
another job's issues."""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from eroica.service.db import job_hosts, job_writers, jobs, writing
from eroica.service.errors import Conflict, Invalid, Malformed

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_HEADER = "x-eroica-job-name"
SEEN_EVERY_SECONDS = 5.0     # a run's last_seen is written at most this often by its documents


RETRIED_STATES = ("40P01", "40001")    # PostgreSQL: deadlock detected, serialization failure
T = TypeVar("T")


def retried(work: Callable[[], T], attempts: int = 4) -> T:
    """`work` (one transaction), run again when PostgreSQL aborted it to break a deadlock or a
    serialization conflict between concurrent writers: the transaction did nothing, and running it
    again is what PostgreSQL asks of the client."""
    for attempt in range(attempts):
        try:
            return work()
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) not in RETRIED_STATES or attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")


def valid_job_id(job_id: str, field: str = "job") -> str:
    if not JOB_ID.match(job_id or ""):
        raise Malformed("a job id or name must be 1-128 characters of letters, digits, '.', '_' or '-', "
                               "starting with a letter or digit", field)
    return job_id


def insert_ignore(c: sa.Connection, table: sa.Table, values: dict[str, Any], keys: list[str]) -> bool:
    """Insert a row unless one with the same `keys` exists (no error, no lost race); True when inserted."""
    dialect = postgresql if c.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    # RETURNING, not rowcount: psycopg reports -1 for an INSERT that did nothing
    return c.execute(stmt.returning(table.c[keys[0]])).first() is not None


def claim_writer(eng: sa.Engine, job_id: str, writer: str, now: float | None = None) -> str | None:
    """Bind `job_id` to `writer` ("scope:<glob>": a job token's, or a watched root's) if no writer has it yet;
    the refusal when a writer of another scope has (None: this one may write it). A team's token and its
    root, given the same glob, are one writer (the root replays what the team's sink spooled). The service's
    own token claims nothing and may write any job."""
    with writing(eng) as c:
        dialect = postgresql if c.dialect.name == "postgresql" else sqlite
        c.execute(dialect.insert(job_writers).values(job_id=job_id, writer=writer[:300],
                                                     at=time.time() if now is None else now)
                  .on_conflict_do_nothing(index_elements=["job_id"]))
        owner = c.execute(sa.select(job_writers.c.writer).where(job_writers.c.job_id == job_id)).scalar_one()
    if owner == writer[:300]:
        return None
    return (f"job {job_id!r} was created by a writer of another scope ({owner.split(':', 1)[-1]!r}); only that "
            "scope's token or watched root, or the service's token, may write it")


def insert_or_get(c: sa.Connection, table: sa.Table, values: dict[str, Any], keys: list[str], id_col: str) -> int:
    """The id of the new row, or of the row another transaction inserted with the same `keys` first."""
    dialect = postgresql if c.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    got = c.execute(stmt.returning(table.c[id_col])).scalar()
    if got is None:
        got = c.execute(sa.select(table.c[id_col]).where(*(table.c[k] == values[k] for k in keys))).scalar_one()
    return int(got)


def upsert(c: sa.Connection, table: sa.Table, values: dict[str, Any], keys: list[str]) -> None:
    """Insert a row, or replace the one with the same `keys` (atomic: no delete-then-insert race)."""
    dialect = postgresql if c.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(**values)
    c.execute(stmt.on_conflict_do_update(index_elements=keys,
                                         set_={k: stmt.excluded[k] for k in values if k not in keys}))


@functools.cache
def _run_statements(dialect_name: str) -> tuple[Any, Any]:
    """touch_run's hot statements, built once (see eroica.service.bulk)."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    listed = sa.exists().where(job_hosts.c.job_id == sa.bindparam("job"), job_hosts.c.host == sa.bindparam("host"))
    seen = sa.select(jobs.c.world_size, jobs.c.name, jobs.c.last_seen, jobs.c.ended_at,
                     listed.label("host_listed")).where(jobs.c.id == sa.bindparam("job"))
    return seen, dialect.insert(job_hosts).on_conflict_do_nothing(index_elements=["job_id", "host"])


def touch_run(c: sa.Connection, job_id: str, name: str | None, world: int, host: str | None, now: float,
              field: str) -> None:
    """Create the run or mark it seen (alive again, its host added). A world size that differs from
    the run's is refused (422, naming `field`); so is a job name that differs from the one the run
    already has (409). The name is the run's own id until something names it."""
    if name is not None:
        valid_job_id(name, NAME_HEADER)
    seen_q, host_q = _run_statements(c.dialect.name)
    seen = c.execute(seen_q, {"job": job_id, "host": host or ""}).first()
    known = seen is not None and seen.world_size == world and (not name or seen.name == name)
    # a host's first document adds its row (no lock on the run's row); later ones find it listed
    if known and host and seen is not None and not seen.host_listed:
        c.execute(host_q, {"job_id": job_id, "host": host, "first_seen": now})
    if known and seen is not None and seen.ended_at is None and now - seen.last_seen < SEEN_EVERY_SECONDS:
        return                  # nothing else to change: the hot path of a wide window
    insert_ignore(c, jobs, {"id": job_id, "name": name or job_id, "world_size": world, "hosts": [],
                            "first_seen": now, "last_seen": now}, ["id"])
    job = c.execute(sa.select(jobs.c.world_size, jobs.c.name).where(jobs.c.id == job_id)
                    .with_for_update(key_share=True)).one()
    if job.world_size != world:
        raise Invalid(f"job {job_id!r} has world size {job.world_size}, this one says {world}", field)
    upd: dict[str, Any] = {"last_seen": now, "ended_at": None, "ended_by": None}
    if name and job.name != name:
        if job.name != job_id:
            raise Conflict(f"run {job_id!r} belongs to job {job.name!r}, not {name!r}: a run's job name "
                                   "cannot change", NAME_HEADER)
        upd["name"] = name
    c.execute(jobs.update().where(jobs.c.id == job_id).values(**upd))
    if host and not known:
        insert_ignore(c, job_hosts, {"job_id": job_id, "host": host, "first_seen": now}, ["job_id", "host"])


def name_of(c: sa.Connection, job_id: str) -> str | None:
    """The run's job name, None when the run is not known."""
    got = c.execute(sa.select(jobs.c.name).where(jobs.c.id == job_id)).scalar()
    return str(got) if got is not None else None
