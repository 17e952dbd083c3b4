"""Recovered GPU time, measured from the job's own always-on step-time series.

For an issue that is still open (acknowledged, linked): the healthy reference is the job's median
step before the issue's first window, the slow phase is the median step inside its last window (the
diagnosis's), and the series after that window says whether the job came back: recovered when two
summaries in a row are within RECOVERY_BAND of the healthy reference. From that step on, every
summary gives back (slow - its median) x its steps x the job's accelerators, accumulated while the
job runs. A recovered issue is closed as recovered by eroica (its alert resolves); one that is not
says so with the numbers.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from eroica.service.db import diagnoses, issues, jobs, steps, windows
from eroica.service.lifecycle import transition

RECOVERY_BAND = 0.10          # within 10% of the healthy step: the detector's own noise band is wider
RUN_OF = 2                    # summaries in a row


def measure(series: Sequence[Any], first_start: int, last_end: int, slow: float, world: int) -> dict[str, Any] | None:
    before = [s.median_seconds for s in series if s.last_step < first_start]
    after = [s for s in series if s.first_step >= last_end]
    if not before:
        return None
    healthy = statistics.median(before)
    limit = healthy * (1 + RECOVERY_BAND)
    start = next((i for i in range(len(after) - RUN_OF + 1)
                  if all(s.median_seconds <= limit for s in after[i:i + RUN_OF])), None)
    hours = 0.0
    if start is not None:
        hours = sum(max(0.0, slow - s.median_seconds) * (s.last_step - s.first_step + 1) * world
                    for s in after[start:]) / 3600
    return {"healthy_seconds": round(healthy, 6), "slow_seconds": round(slow, 6),
            "current_seconds": round(after[-1].median_seconds, 6) if after else None,
            "band_ratio": RECOVERY_BAND, "recovered": start is not None,
            "recovered_from_step": after[start].first_step if start is not None else None,
            "summaries_after": len(after), "accelerator_hours": round(hours, 6)}


def assess(eng: sa.Engine, now: float | None = None) -> list[int]:
    """Measure every open issue; close those whose job came back as recovered. The ids it closed."""
    now = time.time() if now is None else now
    closed = []
    with eng.connect() as c:
        open_ = c.execute(sa.select(issues).where(issues.c.state.in_(("open", "acknowledged", "linked")))
                          ).mappings().all()
    for i in open_:
        with eng.connect() as c:
            series = c.execute(sa.select(steps).where(steps.c.job_id == i["job_id"]).order_by(steps.c.first_step)
                               ).all()
            first_pk = next((h["window"] for h in i["history"] if "window" in h), i["last_window_pk"])
            first = c.execute(sa.select(windows.c.start_step).where(windows.c.pk == first_pk)).scalar()
            last = c.execute(sa.select(windows.c.end_step).where(windows.c.pk == i["last_window_pk"])).scalar()
            body = c.execute(sa.select(diagnoses.c.body).where(diagnoses.c.window_pk == i["last_window_pk"])).scalar()
            world = c.execute(sa.select(jobs.c.world_size).where(jobs.c.id == i["job_id"])).scalar()
        if not series or first is None or last is None or body is None:
            continue
        slow = json.loads(gzip.decompress(body))["windows"][0]["steps"]["during_median_seconds"]
        m = measure(series, first, last, float(slow or 0.0), int(world or 1))
        if m is None or m == i["recovery"]:
            continue
        with eng.begin() as c:
            c.execute(issues.update().where(issues.c.id == i["id"]).values(recovery=m))
        if m["recovered"]:
            transition(eng, i["id"], "recovered", "eroica", why=(
                f"step time {m['current_seconds']:.3f} s back within {RECOVERY_BAND:.0%} of the healthy "
                f"{m['healthy_seconds']:.3f} s (slow {m['slow_seconds']:.3f} s) from step {m['recovered_from_step']}"),
                now=now)
            closed.append(int(i["id"]))
    return closed
