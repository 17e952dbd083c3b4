"""Hangs in the service: each rank's watchdog posts its snapshot (`POST /v1/jobs/{id}/hang`); the
service keeps the newest per rank, localizes the job's latest hang with the engine
(eroica.engine.hang) on every snapshot, and opens or updates the issue its culprit ranks name, so
the alert goes out while the job still waits (before the collective timeout kills it)."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from eroica.engine.hang import HangFinding, latest, localize_snapshots
from eroica.service.db import hangs, issues, jobs
from eroica.service.errors import IngestError
from eroica.service.lifecycle import open_issue

CONFIDENT = 0.5
FIELDS = ("rank", "world_size", "wall_time", "last_step", "stalled_seconds", "limit_seconds", "stack")


def parse(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IngestError(422, f"not JSON: {exc}", "body") from exc
    if not isinstance(doc, dict) or doc.get("schema") != "eroica.hang/v1":
        raise IngestError(422, "not an eroica.hang/v1 snapshot", "schema")
    missing = [f for f in FIELDS if f not in doc]
    if missing:
        raise IngestError(422, f"the snapshot has no {missing[0]!r}", missing[0])
    if not isinstance(doc["rank"], int) or not 0 <= doc["rank"] < int(doc["world_size"]):
        raise IngestError(422, f"rank {doc['rank']!r} is not in 0..world_size-1", "rank")
    return doc


def add(eng: sa.Engine, job_id: str, doc: dict[str, Any], name: str | None = None,
        now: float | None = None) -> HangFinding | None:
    """Keep the rank's snapshot, localize the job's latest hang, fold a confident verdict into its issue."""
    now = time.time() if now is None else now
    with eng.begin() as c:
        if c.execute(sa.select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
            c.execute(jobs.insert().values(id=job_id, name=name or job_id, world_size=int(doc["world_size"]),
                                           hosts=[doc["host"]] if doc.get("host") else [], first_seen=now,
                                           last_seen=now))
        c.execute(hangs.delete().where(hangs.c.job_id == job_id, hangs.c.rank == doc["rank"]))
        c.execute(hangs.insert().values(job_id=job_id, rank=doc["rank"], wall_time=float(doc["wall_time"]),
                                        body=doc, at=now))
        snaps = [r.body for r in c.execute(sa.select(hangs.c.body).where(hangs.c.job_id == job_id))]
        f = localize_snapshots(latest(snaps))
        if f is not None and f.ranks and f.confidence >= CONFIDENT:
            _issue(c, job_id, f, now)
    return f


def current(eng: sa.Engine, job_id: str) -> HangFinding | None:
    with eng.connect() as c:
        snaps = [r.body for r in c.execute(sa.select(hangs.c.body).where(hangs.c.job_id == job_id))]
    return localize_snapshots(latest(snaps))


def _issue(c: sa.Connection, job_id: str, f: HangFinding, now: float) -> None:
    ranks = ",".join(map(str, f.ranks))
    where = f"{f.where.function} ({f.where.file}:{f.where.line})" if f.where else None
    row = c.execute(sa.select(issues).where(issues.c.job_id == job_id, issues.c.root_cause == f.root_cause,
                                            issues.c.ranks == ranks)).mappings().first()
    if row is None:
        open_issue(c, job_id, f.root_cause, f.category, ranks, where, f.confidence, now, why=f"hang: {f.summary[:300]}")
    else:
        c.execute(issues.update().where(issues.c.id == row["id"]).values(
            last_seen=now, top_confidence=max(row["top_confidence"], f.confidence)))
