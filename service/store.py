"""What the service keeps, and how: ingest one rank's document (idempotent), decide when a window is
ready, claim it for diagnosis (exactly once, across replicas), store its diagnosis and findings.

Every write is one short transaction. Claims work on SQLite and PostgreSQL alike: one
`UPDATE ... WHERE pk = (candidate) AND <still claimable> RETURNING pk`, with the candidate chosen
`FOR UPDATE SKIP LOCKED` where the database has it (PostgreSQL); SQLite serializes writers.
"""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from eroica.engine import story
from eroica.schema.diagnosis import CulpritStory, Diagnosis
from eroica.schema.patterns import PatternsDoc
from eroica.service.bulk import ingest_many
from eroica.service.db import batch_columns, diagnoses, findings, issues, jobs, reading, steps, windows, writing
from eroica.service.errors import NotFound
from eroica.service.lifecycle import OPEN_STATES, RESEND, record_findings
from eroica.service.runs import JOB_ID, insert_ignore, touch_run, valid_job_id

__all__ = ["JOB_ID", "Ingested", "valid_job_id"]

LEASE_SECONDS = 120.0
MAX_ATTEMPTS = 3          # a window whose diagnosis failed (or whose replica died) this often fails for good


@dataclass(frozen=True)
class Ingested:
    window_pk: int
    created: bool          # False: the same document was already stored (an idempotent re-upload)


def ingest(eng: sa.Engine, job_id: str, doc: PatternsDoc, text: bytes, now: float | None = None,
           name: str | None = None) -> Ingested:
    """Store one rank's document of one window of run `job_id` of job `name` (the run's id when none).
    The same document again is a no-op; another document for a rank already stored is refused (409);
    a rank outside the window's world is refused (422). (A batch of one: eroica.service.bulk.)"""
    got = ingest_many(eng, job_id, [(1, doc, text)], now, name, alone=True)
    return Ingested(got.windows[0], bool(got.created))


def mark_ready(eng: sa.Engine, grace_seconds: float, now: float | None = None) -> int:
    """Windows whose every rank reported, or whose last document is `grace_seconds` old, become ready."""
    now = time.time() if now is None else now
    with writing(eng) as c:
        res = c.execute(windows.update().where(
            windows.c.status == "collecting",
            sa.or_(windows.c.ranks_reported >= windows.c.world_size, windows.c.last_doc_at <= now - grace_seconds),
        ).values(status="ready"))
        return int(res.rowcount or 0)


def claim(eng: sa.Engine, worker: str, now: float | None = None, lease_seconds: float = LEASE_SECONDS,
          max_attempts: int = MAX_ATTEMPTS) -> int | None:
    """Take one ready window (or one whose claim expired) for diagnosis; None when there is none.
    A window whose claim expired `max_attempts` times (its replica or worker died each time) fails
    for good instead, with that reason, rather than take a replica down with it again."""
    now = time.time() if now is None else now
    expired = sa.and_(windows.c.status == "claimed", windows.c.lease_until < now)
    with writing(eng) as c:
        c.execute(windows.update().where(expired, windows.c.attempts >= max_attempts).values(
            status="failed", lease_until=None, claimed_by=None,
            error=sa.func.substr(sa.literal(f"failed for good: its diagnosis was claimed {max_attempts} times and "
                                            "never finished (the replica or its worker died, or it hung); last: ")
                                 + sa.func.coalesce(windows.c.error, sa.literal("no error recorded")), 1, 2000)))
    claimable = sa.or_(windows.c.status == "ready", expired)
    cand = sa.select(windows.c.pk).where(claimable).order_by(windows.c.last_doc_at).limit(1)
    if eng.dialect.name == "postgresql":
        cand = cand.with_for_update(skip_locked=True)
    with writing(eng) as c:
        pk = c.execute(windows.update().where(windows.c.pk == cand.scalar_subquery(), claimable).values(
            status="claimed", claimed_by=worker, lease_until=now + lease_seconds,
            attempts=windows.c.attempts + 1).returning(windows.c.pk)).scalar()
    return int(pk) if pk is not None else None


def window_and_history(eng: sa.Engine, pk: int) -> tuple[dict[str, Any], list[str]]:
    """A window's row and the history summaries (WindowHistory JSON) of the job's earlier windows that
    were diagnosed, oldest first: never their documents (the diagnosis worker reads the window's own,
    eroica.service.worker.diagnose_stored)."""
    with reading(eng) as c:
        w = dict(c.execute(sa.select(windows).where(windows.c.pk == pk)).mappings().one())
        history = [h for h in c.execute(
            sa.select(diagnoses.c.history).join(windows, windows.c.pk == diagnoses.c.window_pk).where(
                windows.c.job_id == w["job_id"], windows.c.start_step < w["start_step"],
                diagnoses.c.history.is_not(None)).order_by(windows.c.start_step)).scalars()]
        return w, history


def findings_where(c: sa.Connection, q: sa.Select[Any], limit: int, host: str | None = None) -> list[dict[str, Any]]:
    """The newest `limit` findings of `q` (a select of the findings table) whose hosts include `host`
    (any, when None). The host is matched in the stored list, so rows are read a page at a time
    until `limit` match: a page is never short while older matches exist."""
    out: list[dict[str, Any]] = []
    page = limit if host is None else max(limit, 500)
    q = q.order_by(findings.c.created_at.desc(), findings.c.id.desc())
    offset = 0
    while len(out) < limit:
        rows = c.execute(q.limit(page).offset(offset)).mappings().all()
        out += [dict(r) for r in rows if host is None or host in r["hosts"]]
        if len(rows) < page:
            break
        offset += page
    return out[:limit]


def store_diagnosis(eng: sa.Engine, pk: int, worker: str, d: Diagnosis, now: float | None = None) -> bool:
    """Store the window's diagnosis and findings, replacing an earlier one; False when the claim was lost."""
    now = time.time() if now is None else now
    (wd,) = d.windows
    with writing(eng) as c:
        w = c.execute(sa.select(windows.c.claimed_by, windows.c.status, windows.c.job_id)
                      .where(windows.c.pk == pk).with_for_update(key_share=True)).first()
        if w is None or w.claimed_by != worker or w.status != "claimed":
            return False
        c.execute(findings.delete().where(findings.c.window_pk == pk))
        c.execute(diagnoses.delete().where(diagnoses.c.window_pk == pk))
        c.execute(batch_columns.delete().where(batch_columns.c.window_pk == pk))   # needed only until now
        c.execute(diagnoses.insert().values(window_pk=pk, body=gzip.compress(d.model_dump_json(by_alias=True).encode()),
                                            healthy=wd.healthy, diagnosable=wd.diagnosable, created_at=now,
                                            history=wd.history.model_dump_json() if wd.history else None))
        for f in wd.findings:
            c.execute(findings.insert().values(
                window_pk=pk, job_id=w.job_id, root_cause=f.root_cause, category=f.category.value, ranks=f.ranks,
                hosts=f.hosts, function=f.function, confidence=f.confidence, summary=f.summary,
                rule_ids=f.rule_ids, created_at=now, devices=f.devices, scope=f.scope))
        c.execute(windows.update().where(windows.c.pk == pk).values(
            status="done", diagnosed_at=now, lease_until=None, error=None,
            diagnoses_stored=windows.c.diagnoses_stored + 1))
        record_findings(c, pk, w.job_id, d, now)
    return True


def release(eng: sa.Engine, pk: int, worker: str, error: str, max_attempts: int = MAX_ATTEMPTS,
            final: bool = False) -> str:
    """A claimed window whose diagnosis did not get stored: back to `ready` for another attempt, or
    `failed` for good once it has had `max_attempts` (or the error is `final`), with the reason kept.
    Returns the window's new status ("" when the claim was no longer this worker's)."""
    with writing(eng) as c:
        w = c.execute(sa.select(windows.c.attempts, windows.c.claimed_by, windows.c.status)
                      .where(windows.c.pk == pk).with_for_update(key_share=True)).first()
        if w is None or w.claimed_by != worker or w.status != "claimed":
            return ""
        if final or w.attempts >= max_attempts:
            status, why = "failed", f"failed for good after {w.attempts} attempt(s): {error}"
        else:
            status, why = "ready", f"attempt {w.attempts} of {max_attempts} failed: {error}"
        c.execute(windows.update().where(windows.c.pk == pk).values(status=status, error=why[:2000],
                                                                    lease_until=None, claimed_by=None))
    return status


def add_steps(eng: sa.Engine, job_id: str, first: int, last: int, median: float, p90: float, world_size: int,
              now: float | None = None, name: str | None = None) -> None:
    """One summary of the run's always-on step-time series (idempotent on its first step); the run is
    known from its first summary on, before any window."""
    now = time.time() if now is None else now
    with writing(eng) as c:
        touch_run(c, job_id, name, world_size, None, now, "world_size")
        insert_ignore(c, steps, {"job_id": job_id, "first_step": first, "last_step": last, "median_seconds": median,
                                 "p90_seconds": p90, "at": now}, ["job_id", "first_step"])


def end_job(eng: sa.Engine, job_id: str, by: str, now: float | None = None) -> bool:
    """Mark a run ended (its rank 0 closed, or it fell silent): its open issues' alerts resolve.
    False when it was already ended."""
    now = time.time() if now is None else now
    with writing(eng) as c:
        if c.execute(sa.select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
            raise NotFound(f"no job {job_id!r}", "job")
        done = c.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.ended_at.is_(None))
                         .values(ended_at=now, ended_by=by)).rowcount
        if done:
            c.execute(issues.update().where(issues.c.job_id == job_id, issues.c.state.in_(OPEN_STATES))
                      .values(**RESEND))
    return bool(done)


def end_silent(eng: sa.Engine, silent_seconds: float, now: float | None = None) -> list[str]:
    """Runs that sent nothing for `silent_seconds` (killed without closing) are ended."""
    now = time.time() if now is None else now
    with reading(eng) as c:
        ids = list(c.execute(sa.select(jobs.c.id).where(jobs.c.ended_at.is_(None),
                                                        jobs.c.last_seen < now - silent_seconds)).scalars())
    return [j for j in ids if end_job(eng, j, "silence", now)]


STORY_WINDOWS = 50      # a job's story is read over its latest windows


def story_of(c: sa.Connection, job_id: str) -> list[CulpritStory]:
    """The job's culprits over its latest STORY_WINDOWS diagnosed windows (eroica.engine's `story`): each
    stored diagnosis holds its own window."""
    rows = c.execute(sa.select(diagnoses.c.body).join(windows, windows.c.pk == diagnoses.c.window_pk)
                     .where(windows.c.job_id == job_id).order_by(windows.c.start_step.desc())
                     .limit(STORY_WINDOWS)).scalars()
    return story([w for body in rows for w in Diagnosis.model_validate_json(gzip.decompress(body)).windows])


def diagnosis_of(eng: sa.Engine, pk: int) -> bytes | None:
    with reading(eng) as c:
        body = c.execute(sa.select(diagnoses.c.body).where(diagnoses.c.window_pk == pk)).scalar()
    return gzip.decompress(body) if body is not None else None
