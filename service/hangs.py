"""Hangs in the service: each rank's watchdog posts its snapshot (`POST /v1/jobs/{id}/hang`); the
service keeps the newest per rank, localizes the job's latest hang with the engine
(eroica.engine.hang) on every snapshot, and opens or updates the issue its culprit ranks name, so
the alert goes out while the job still waits (before the collective timeout kills it)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from eroica.engine.hang import latest, localize_snapshots
from eroica.schema.hang import HangFinding
from eroica.service.db import hangs, reading, writing
from eroica.service.inputs import parse_hang
from eroica.service.lifecycle import fold_finding
from eroica.service.runs import touch_run, upsert

CONFIDENT = 0.5


def parse(body: bytes) -> dict[str, Any]:
    """A hang snapshot, validated (types and bounds: eroica.service.inputs) and reduced to the fields
    the engine reads; a ServiceError naming the field otherwise."""
    return parse_hang(body).model_dump(mode="json", by_alias=True)


def add(eng: sa.Engine, job_id: str, doc: dict[str, Any], name: str | None = None,
        now: float | None = None) -> HangFinding | None:
    """Keep the rank's snapshot, localize the job's latest hang, fold a confident verdict into its issue.
    A snapshot whose world size is not the run's is refused (422, `world_size`)."""
    now = time.time() if now is None else now
    with writing(eng) as c:                 # the write: short, the engine is not run holding it
        touch_run(c, job_id, name, int(doc["world_size"]), doc.get("host"), now, "world_size")
        upsert(c, hangs, {"job_id": job_id, "rank": doc["rank"], "wall_time": float(doc["wall_time"]), "body": doc,
                          "at": now}, ["job_id", "rank"])
    f = current(eng, job_id)
    if f is not None and f.ranks and f.confidence >= CONFIDENT:
        with writing(eng) as c:
            _issue(c, job_id, f, now)
    return f


def current(eng: sa.Engine, job_id: str) -> HangFinding | None:
    with reading(eng) as c:
        snaps = [r.body for r in c.execute(sa.select(hangs.c.body).where(hangs.c.job_id == job_id))]
    return localize_snapshots(latest(snaps))


def _issue(c: sa.Connection, job_id: str, f: HangFinding, now: float) -> None:
    """The hang into the job's issues, through the same fold as a window's findings."""
    where = f"{f.where.function} ({f.where.file}:{f.where.line})" if f.where else None
    fold_finding(c, job_id, f.root_cause, f.category, sorted(f.ranks), where, f.confidence, now,
                 why=f"hang: {f.summary[:300]}", resend=False)
