"""Hangs in the service: each rank's watchdog posts its snapshot (`POST /v1/jobs/{id}/hang`); the
service keeps the newest per rank, localizes the job's latest hang with the engine
(eroica.engine.hang) on every snapshot, and opens or updates the issue its culprit ranks name, so
the alert goes out while the job still waits (before the collective timeout kills it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from eroica.engine.hang import latest, localize_snapshots
from eroica.engine.rules.layers import KnowledgeSpec, compiled_once
from eroica.engine.taxonomy import load_taxonomy
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
        now: float | None = None, knowledge_dirs: Sequence[str] = ()) -> HangFinding | None:
    """Keep the rank's snapshot, localize the job's latest hang, fold a confident verdict into its issue.
    A snapshot whose world size is not the run's is refused (422, `world_size`). `knowledge_dirs`: the
    site knowledge the service diagnoses with (its hang rules, overrides and root causes)."""
    now = time.time() if now is None else now
    with writing(eng) as c:                 # the write: short, the engine is not run holding it
        touch_run(c, job_id, name, int(doc["world_size"]), doc.get("host"), now, "world_size")
        upsert(c, hangs, {"job_id": job_id, "rank": doc["rank"], "wall_time": float(doc["wall_time"]), "body": doc,
                          "at": now}, ["job_id", "rank"])
    f = current(eng, job_id, knowledge_dirs)
    if f is not None and f.ranks and f.confidence >= CONFIDENT:
        with writing(eng) as c:
            _issue(c, job_id, f, now)
    return f


def current(eng: sa.Engine, job_id: str, knowledge_dirs: Sequence[str] = ()) -> HangFinding | None:
    """The job's latest hang, localized with the same knowledge as its windows (the one compile path)."""
    with reading(eng) as c:
        snaps = [r.body for r in c.execute(sa.select(hangs.c.body).where(hangs.c.job_id == job_id))]
    if not snaps:
        return None
    spec = KnowledgeSpec(tuple(Path(d) for d in knowledge_dirs))
    return localize_snapshots(latest(snaps), compiled_once(spec), load_taxonomy(site_dirs=list(spec.site_dirs)))


def _issue(c: sa.Connection, job_id: str, f: HangFinding, now: float) -> None:
    """The hang into the job's issues, through the same fold as a window's findings."""
    where = f"{f.where.function} ({f.where.file}:{f.where.line})" if f.where else None
    fold_finding(c, job_id, f.root_cause, f.category, sorted(f.ranks), where, f.confidence, now,
                 why=f"hang: {f.summary[:300]}", resend=False)
