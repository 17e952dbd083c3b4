"""What the service keeps, and how: ingest one rank's document (idempotent), decide when a window is
ready, claim it for diagnosis (exactly once, across replicas), store its diagnosis and findings.

Every write is one short transaction. Claims work on SQLite and PostgreSQL alike: one
`UPDATE ... WHERE pk = (candidate) AND <still claimable> RETURNING pk`, with the candidate chosen
`FOR UPDATE SKIP LOCKED` where the database has it (PostgreSQL); SQLite serializes writers.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from eroica.collector.facts import PatternsDoc
from eroica.engine.diagnosis import Diagnosis
from eroica.service.db import diagnoses, documents, findings, issues, jobs, steps, windows
from eroica.service.errors import IngestError
from eroica.service.lifecycle import OPEN_STATES, record_findings

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LEASE_SECONDS = 120.0


@dataclass(frozen=True)
class Ingested:
    window_pk: int
    created: bool          # False: the same document was already stored (an idempotent re-upload)


def valid_job_id(job_id: str) -> str:
    if not JOB_ID.match(job_id or ""):
        raise IngestError(400, "job id must be 1-128 characters of letters, digits, '.', '_' or '-', starting with "
                               "a letter or digit", "job")
    return job_id


def _touch_run(c: sa.Connection, job_id: str, name: str | None, world: int, host: str | None, now: float,
               field: str) -> None:
    """Create the run or mark it seen (alive again, its name and host added); a document or summary
    whose world size differs from the run's is refused (422, naming `field`). The name is the run's
    own id when the sink sends none."""
    if name is not None:
        valid_job_id(name)
    job = c.execute(sa.select(jobs.c.world_size, jobs.c.hosts, jobs.c.name).where(jobs.c.id == job_id)).first()
    if job is None:
        c.execute(jobs.insert().values(id=job_id, name=name or job_id, world_size=world, hosts=[host] if host else [],
                                       first_seen=now, last_seen=now))
        return
    if job.world_size != world:
        raise IngestError(422, f"job {job_id!r} has world size {job.world_size}, this one says {world}", field)
    upd: dict[str, Any] = {"last_seen": now, "ended_at": None, "ended_by": None}
    if host and host not in job.hosts:
        upd["hosts"] = sorted({*job.hosts, host})
    if name and job.name != name:
        upd["name"] = name
    c.execute(jobs.update().where(jobs.c.id == job_id).values(**upd))


def ingest(eng: sa.Engine, job_id: str, doc: PatternsDoc, text: bytes, now: float | None = None,
           name: str | None = None) -> Ingested:
    """Store one rank's document of one window of run `job_id` of job `name` (the run's id when none).
    The same document again is a no-op; another document for a rank already stored is refused (409);
    a rank outside the window's world is refused (422)."""
    now = time.time() if now is None else now
    valid_job_id(job_id)
    rank, world = doc.job.rank, doc.job.world_size
    if rank >= world:
        raise IngestError(422, f"rank {rank} is outside the job's world of {world}", "job.rank")
    digest = hashlib.sha256(text).hexdigest()
    with eng.begin() as c:
        _touch_run(c, job_id, name, world, doc.job.hostname, now, "job.world_size")
        w = c.execute(sa.select(windows).where(windows.c.job_id == job_id,
                                               windows.c.window_id == doc.window.window_id)).mappings().first()
        if w is None:
            pk = c.execute(windows.insert().returning(windows.c.pk).values(
                job_id=job_id, window_id=doc.window.window_id, world_size=world, start_step=doc.window.start_step,
                end_step=doc.window.end_step, trigger=doc.window.trigger, status="collecting", ranks_reported=0,
                first_doc_at=now, last_doc_at=now, attempts=0)).scalar_one()
        else:
            pk = w["pk"]
        old = c.execute(sa.select(documents.c.sha256).where(documents.c.window_pk == pk,
                                                            documents.c.rank == rank)).scalar()
        if old is not None:
            if old != digest:
                raise IngestError(409, f"window {doc.window.window_id} already has a different document for rank "
                                       f"{rank}", "job.rank")
            return Ingested(pk, False)
        c.execute(documents.insert().values(window_pk=pk, rank=rank, sha256=digest, body=gzip.compress(text, 1),
                                            host=doc.job.hostname, received_at=now))
        update: dict[str, Any] = {"ranks_reported": windows.c.ranks_reported + 1, "last_doc_at": now}
        opened = doc.window.opened_unix_seconds
        if opened is not None and (w is None or w["window_opened_at"] is None or opened < w["window_opened_at"]):
            update["window_opened_at"] = opened
        closed = doc.window.closed_unix_seconds
        if closed is not None and (w is None or w["window_closed_at"] is None or closed > w["window_closed_at"]):
            update["window_closed_at"] = closed
        if w is not None and w["status"] in ("done", "failed"):
            update["status"] = "ready"       # a late rank: diagnose the window again with it
        c.execute(windows.update().where(windows.c.pk == pk).values(**update))
    return Ingested(pk, True)


def mark_ready(eng: sa.Engine, grace_seconds: float, now: float | None = None) -> int:
    """Windows whose every rank reported, or whose last document is `grace_seconds` old, become ready."""
    now = time.time() if now is None else now
    with eng.begin() as c:
        res = c.execute(windows.update().where(
            windows.c.status == "collecting",
            sa.or_(windows.c.ranks_reported >= windows.c.world_size, windows.c.last_doc_at <= now - grace_seconds),
        ).values(status="ready"))
        return int(res.rowcount or 0)


def claim(eng: sa.Engine, worker: str, now: float | None = None) -> int | None:
    """Take one ready window (or one whose claim expired) for diagnosis; None when there is none."""
    now = time.time() if now is None else now
    claimable = sa.or_(windows.c.status == "ready",
                       sa.and_(windows.c.status == "claimed", windows.c.lease_until < now))
    cand = sa.select(windows.c.pk).where(claimable).order_by(windows.c.last_doc_at).limit(1)
    if eng.dialect.name == "postgresql":
        cand = cand.with_for_update(skip_locked=True)
    with eng.begin() as c:
        pk = c.execute(windows.update().where(windows.c.pk == cand.scalar_subquery(), claimable).values(
            status="claimed", claimed_by=worker, lease_until=now + LEASE_SECONDS,
            attempts=windows.c.attempts + 1).returning(windows.c.pk)).scalar()
    return int(pk) if pk is not None else None


def window_docs(eng: sa.Engine, pk: int) -> tuple[dict[str, Any], list[bytes], list[tuple[str, list[bytes]]]]:
    """A window's row, its documents, and the documents of the job's earlier windows (its history)."""
    with eng.connect() as c:
        w = dict(c.execute(sa.select(windows).where(windows.c.pk == pk)).mappings().one())
        earlier = c.execute(sa.select(windows.c.pk, windows.c.window_id).where(
            windows.c.job_id == w["job_id"], windows.c.start_step < w["start_step"])
            .order_by(windows.c.start_step)).all()

        def docs(p: int) -> list[bytes]:
            return [gzip.decompress(b) for b in c.execute(
                sa.select(documents.c.body).where(documents.c.window_pk == p).order_by(documents.c.rank)).scalars()]
        return w, docs(pk), [(wid, docs(p)) for p, wid in earlier]


def store_diagnosis(eng: sa.Engine, pk: int, worker: str, d: Diagnosis, now: float | None = None) -> bool:
    """Store the window's diagnosis and findings, replacing an earlier one; False when the claim was lost."""
    now = time.time() if now is None else now
    (wd,) = d.windows
    with eng.begin() as c:
        w = c.execute(sa.select(windows.c.claimed_by, windows.c.status, windows.c.job_id)
                      .where(windows.c.pk == pk)).first()
        if w is None or w.claimed_by != worker or w.status != "claimed":
            return False
        c.execute(findings.delete().where(findings.c.window_pk == pk))
        c.execute(diagnoses.delete().where(diagnoses.c.window_pk == pk))
        c.execute(diagnoses.insert().values(window_pk=pk, body=gzip.compress(d.model_dump_json(by_alias=True).encode()),
                                            healthy=wd.healthy, diagnosable=wd.diagnosable, created_at=now))
        for f in wd.findings:
            c.execute(findings.insert().values(
                window_pk=pk, job_id=w.job_id, root_cause=f.root_cause, category=f.category.value, ranks=f.ranks,
                hosts=f.hosts, function=f.function, confidence=f.confidence, summary=f.summary,
                rule_ids=f.rule_ids, created_at=now))
        c.execute(windows.update().where(windows.c.pk == pk).values(status="done", diagnosed_at=now,
                                                                    lease_until=None, error=None))
        record_findings(c, pk, w.job_id, d, now)
    return True


def fail(eng: sa.Engine, pk: int, worker: str, error: str) -> None:
    with eng.begin() as c:
        c.execute(windows.update().where(windows.c.pk == pk, windows.c.claimed_by == worker)
                  .values(status="failed", error=error[:2000], lease_until=None))


def add_steps(eng: sa.Engine, job_id: str, first: int, last: int, median: float, p90: float, world_size: int,
              now: float | None = None, name: str | None = None) -> None:
    """One summary of the run's always-on step-time series (idempotent on its first step); the run is
    known from its first summary on, before any window."""
    now = time.time() if now is None else now
    with eng.begin() as c:
        _touch_run(c, job_id, name, world_size, None, now, "world_size")
        if c.execute(sa.select(steps.c.first_step).where(steps.c.job_id == job_id,
                                                         steps.c.first_step == first)).first() is None:
            c.execute(steps.insert().values(job_id=job_id, first_step=first, last_step=last, median_seconds=median,
                                            p90_seconds=p90, at=now))


def end_job(eng: sa.Engine, job_id: str, by: str, now: float | None = None) -> bool:
    """Mark a run ended (its rank 0 closed, or it fell silent): its open issues' alerts resolve.
    False when it was already ended."""
    now = time.time() if now is None else now
    with eng.begin() as c:
        if c.execute(sa.select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
            raise IngestError(404, f"no job {job_id!r}", "job")
        done = c.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.ended_at.is_(None))
                         .values(ended_at=now, ended_by=by)).rowcount
        if done:
            c.execute(issues.update().where(issues.c.job_id == job_id, issues.c.state.in_(OPEN_STATES))
                      .values(alert_dirty=True))
    return bool(done)


def end_silent(eng: sa.Engine, silent_seconds: float, now: float | None = None) -> list[str]:
    """Runs that sent nothing for `silent_seconds` (killed without closing) are ended."""
    now = time.time() if now is None else now
    with eng.connect() as c:
        ids = list(c.execute(sa.select(jobs.c.id).where(jobs.c.ended_at.is_(None),
                                                        jobs.c.last_seen < now - silent_seconds)).scalars())
    return [j for j in ids if end_job(eng, j, "silence", now)]


def diagnosis_of(eng: sa.Engine, pk: int) -> bytes | None:
    with eng.connect() as c:
        body = c.execute(sa.select(diagnoses.c.body).where(diagnoses.c.window_pk == pk)).scalar()
    return gzip.decompress(body) if body is not None else None
