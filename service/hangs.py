"""Hangs in the service: each rank's watchdog posts its snapshot (`POST /v1/jobs/{id}/hang`) when it
suspects a hang, again when it confirms it, and when the rank steps again (resolved). The API thread
only stores it (the newest per rank) and marks the job's verdict out of date; the dispatch loop
hands the job to the diagnosis worker, as it does a window, before any window (a hung job waits for
nobody): the worker localizes the hang with the same compiled knowledge as the windows
(eroica.engine.hang), and the verdict is stored once and served from the store.

The worker waits SETTLE_SECONDS after a job's newest snapshot (the ranks of one stall write theirs
within a second of each other), so a verdict is not made of the first rank's snapshot alone. A
verdict is folded into the job's issues, and counted, only when what it says changed (its stage,
cause, ranks). One at or above CONFIDENT that names ranks opens the culprit's issue (and so the
alert) when it is confirmed, or already when it is suspected if the service is told to
(`hang_alert_on`); when the hang resolves (the job stepped again), its issue is closed as recovered
and the alert resolves."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from eroica.schema.hang import HangFinding
from eroica.service.db import hang_verdicts, hangs, issues, reading, writing
from eroica.service.errors import ServiceError
from eroica.service.inputs import parse_hang
from eroica.service.lifecycle import OPEN_STATES, fold_finding, transition
from eroica.service.runs import touch_run, upsert

CONFIDENT = 0.5
ALERT_ON = ("confirmed", "suspected")
SETTLE_SECONDS = 1.0


def parse(body: bytes) -> dict[str, Any]:
    """A hang snapshot, validated (types and bounds: eroica.service.inputs) and reduced to the fields
    the engine reads; a ServiceError naming the field otherwise."""
    return parse_hang(body).model_dump(mode="json", by_alias=True)


def add(eng: sa.Engine, job_id: str, doc: dict[str, Any], name: str | None = None, now: float | None = None) -> None:
    """Keep the rank's snapshot and mark the job's verdict out of date (the worker makes it). A
    snapshot whose world size is not the run's is refused (422, `world_size`)."""
    now = time.time() if now is None else now
    with writing(eng) as c:
        touch_run(c, job_id, name, int(doc["world_size"]), doc.get("host"), now, "world_size")
        upsert(c, hangs, {"job_id": job_id, "rank": doc["rank"], "wall_time": float(doc["wall_time"]), "body": doc,
                          "at": now}, ["job_id", "rank"])
        bumped = c.execute(sa.update(hang_verdicts).where(hang_verdicts.c.job_id == job_id)
                           .values(version=hang_verdicts.c.version + 1, changed_at=now)).rowcount
        if not bumped:
            c.execute(sa.insert(hang_verdicts).values(job_id=job_id, version=1, done_version=0, first_at=now,
                                                      changed_at=now))


def claim(eng: sa.Engine, who: str, lease_seconds: float, now: float | None = None,
          settle_seconds: float = SETTLE_SECONDS) -> tuple[str, int] | None:
    """A job whose verdict is out of date, whose newest snapshot is `settle_seconds` old and that no
    other replica is localizing: (job, the snapshots' version now), claimed for `lease_seconds`;
    None when there is none."""
    now = time.time() if now is None else now
    t = hang_verdicts.c
    free = sa.or_(t.claimed_until.is_(None), t.claimed_until < now)
    with reading(eng) as c:
        rows = c.execute(sa.select(t.job_id, t.version).where(t.version > t.done_version, free,
                                                              t.changed_at <= now - settle_seconds)
                         .order_by(t.first_at).limit(8)).all()
    for job_id, version in rows:
        with writing(eng) as c:
            got = c.execute(sa.update(hang_verdicts).where(t.job_id == job_id, t.version > t.done_version, free)
                            .values(claimed_by=who, claimed_until=now + lease_seconds)).rowcount
        if got:
            return str(job_id), int(version)
    return None


def snapshots(eng: sa.Engine, job_id: str) -> tuple[list[dict[str, Any]], int]:
    """The job's stored snapshots and the version they make."""
    with reading(eng) as c:     # the version first: a snapshot stored in between is localized again
        version = c.execute(sa.select(hang_verdicts.c.version).where(hang_verdicts.c.job_id == job_id)).scalar()
        docs = [r.body for r in c.execute(sa.select(hangs.c.body).where(hangs.c.job_id == job_id))]
    return docs, int(version or 0)


def localize_stored(db_url: str, job_id: str, knowledge_dirs: Sequence[str]) -> tuple[int, str | None]:
    """In the diagnosis worker: the job's verdict as JSON (None: no snapshot) and the snapshots'
    version it is of, localized with the knowledge the windows are diagnosed with."""
    from eroica.engine import KnowledgeSpec, compiled_once, load_taxonomy, localize_documents
    from eroica.service.db import make_engine

    eng = make_engine(db_url)
    try:
        docs, version = snapshots(eng, job_id)
    finally:
        eng.dispose()
    spec = KnowledgeSpec(tuple(Path(d) for d in knowledge_dirs))
    f = localize_documents(docs, compiled_once(spec), load_taxonomy(site_dirs=list(spec.site_dirs))) if docs else None
    return version, f.model_dump_json() if f is not None else None


def _says(f: HangFinding | None) -> tuple[object, ...]:
    return (f.state, f.root_cause, tuple(f.ranks), f.confidence >= CONFIDENT) if f is not None else ()


def store_verdict(eng: sa.Engine, job_id: str, who: str, version: int, text: str | None, alert_on: str = "confirmed",
                  now: float | None = None) -> tuple[HangFinding | None, bool]:
    """Store the verdict the worker made of the snapshots' `version` (a newer snapshot leaves the job
    out of date: it is localized again); when it says something new, fold it into the job's issues
    (confident and confirmed, or suspected with alert_on="suspected"), or close the hang's issue as
    recovered when the hang resolved. The verdict, and whether it said something new."""
    now = time.time() if now is None else now
    f = HangFinding.model_validate_json(text) if text is not None else None
    t = hang_verdicts.c
    with writing(eng) as c:
        before = c.execute(sa.select(t.body).where(t.job_id == job_id)).scalar()
        changed = _says(HangFinding.model_validate(before) if before else None) != _says(f)
        c.execute(sa.update(hang_verdicts).where(t.job_id == job_id, t.claimed_by == who).values(
            done_version=sa.func.max(t.done_version, version) if c.dialect.name == "sqlite"
            else sa.func.greatest(t.done_version, version),
            claimed_by=None, claimed_until=None, state=f.state if f else None,
            body=f.model_dump(mode="json") if f else None, at=now))
        if changed and f is not None and f.ranks and f.confidence >= CONFIDENT and (
                f.state == "confirmed" or (f.state == "suspected" and alert_on == "suspected")):
            where = f"{f.where.function} ({f.where.file}:{f.where.line})" if f.where else None
            fold_finding(c, job_id, f.root_cause, f.category, sorted(f.ranks), where, f.confidence, now,
                         hosts=f.hosts, why=f"hang ({f.state}): {f.summary[:300]}", resend=False)
        opened: list[int] = []
        if changed and f is not None and f.state == "resolved":
            opened = list(c.execute(sa.select(issues.c.id).where(
                issues.c.job_id == job_id, issues.c.root_cause == f.root_cause,
                issues.c.ranks == ",".join(map(str, sorted(f.ranks))), issues.c.state.in_(OPEN_STATES))).scalars())
    for iid in opened:            # the job stepped again: the hang is over, and so is its alert
        with contextlib.suppress(ServiceError):
            transition(eng, iid, "recovered", "eroica", now=now, why=(
                f"the hang resolved: the job stepped again after {f.stalled_seconds:.0f} s without a step"
                if f is not None else "the hang resolved"))
    return f, changed


def release(eng: sa.Engine, job_id: str, who: str) -> None:
    """Give a claimed job back after a failed localization (it is tried again at the next poll)."""
    with writing(eng) as c:
        c.execute(sa.update(hang_verdicts).where(hang_verdicts.c.job_id == job_id, hang_verdicts.c.claimed_by == who)
                  .values(claimed_by=None, claimed_until=None))


def current(eng: sa.Engine, job_id: str) -> tuple[HangFinding | None, bool]:
    """The job's stored verdict, and whether snapshots came after it (a newer one is being made)."""
    t = hang_verdicts.c
    with reading(eng) as c:
        row = c.execute(sa.select(t.body, t.version, t.done_version).where(t.job_id == job_id)).first()
    if row is None:
        return None, False
    f = HangFinding.model_validate(row.body) if row.body is not None else None
    return f, row.version > row.done_version
