"""Recovered GPU time and time to detect, measured from the job's own always-on step-time series.

For an issue that is still open (acknowledged, linked), in the run of its first window:
- the fault's onset is where the series turned slow before that window: the earliest summary from
  which every one up to the window is above RECOVERY_BAND of the median before it; the onset is the
  end of the last healthy summary (at most half a summary early: a slow
  summary's median means at least half its steps were slow), and time to detect is from there to
  the window's opening;
- the healthy reference is the median step before the onset.
After the issue's last window (the diagnosis's slow step), the series of that run and of any later
run of the same job name (a restart) says whether the job came back: recovered when two summaries in
a row are back, each within RECOVERY_BAND of the healthy reference or with at least GIVEN_BACK of the
slowdown gone. The second half matters on shared hosts, whose speed drifts by more than 10% within
minutes: a 0.15 s step that came back to 0.045 s after a 0.04 s healthy phase is the fault fixed,
not a job still slow. The looser of the two applies: the band for a slowdown under 2x, GIVEN_BACK
above it. From that summary on, each gives back
(slow - its median) x its steps x its run's accelerators, accumulated while the job runs. A recovered
issue is closed as recovered by eroica (its alert resolves); one that is not says so with the numbers.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from eroica.service.db import diagnoses, issues, jobs, reading, steps, windows, writing
from eroica.service.lifecycle import OPEN_STATES, transition

RECOVERY_BAND = 0.10          # within 10% of the healthy step: the detector's own noise band is wider
GIVEN_BACK = 0.90             # or at least 90% of the slow step's excess over the healthy one gone
RUN_OF = 2                    # summaries in a row


class Summary(NamedTuple):
    first_step: int
    last_step: int
    median_seconds: float
    at: float                 # when the service received it (unix seconds)
    world: int                # its run's accelerators


def onset(before: Sequence[Summary]) -> int:
    """The index of the first summary of the slow phase that runs up to the window (len when none):
    the earliest k after which every summary is above RECOVERY_BAND of the median before k. A blip
    earlier, or slow warm-up steps, do not end the healthy phase; a window opened late into the fault
    (its first windows said nothing confident) still finds where the fault began."""
    for k in range(1, len(before)):
        limit = statistics.median(s.median_seconds for s in before[:k]) * (1 + RECOVERY_BAND)
        if all(s.median_seconds > limit for s in before[k:]):
            return k
    return len(before)


def measure(before: Sequence[Summary], after: Sequence[Summary], slow: float,
            opened_at: float | None = None) -> dict[str, Any] | None:
    """What the series says: `before` ends at the issue's first window, `after` starts at its last."""
    k = onset(before)
    if k == 0:
        return None
    healthy = statistics.median(s.median_seconds for s in before[:k])
    limit = max(healthy * (1 + RECOVERY_BAND), slow - GIVEN_BACK * (slow - healthy))
    start = next((i for i in range(len(after) - RUN_OF + 1)
                  if all(s.median_seconds <= limit for s in after[i:i + RUN_OF])), None)
    hours = 0.0
    if start is not None:
        hours = sum(max(0.0, slow - s.median_seconds) * (s.last_step - s.first_step + 1) * s.world
                    for s in after[start:]) / 3600
    onset_at = before[k - 1].at if k < len(before) else None
    detect = round(max(0.0, opened_at - onset_at), 3) if onset_at is not None and opened_at is not None else None
    return {"healthy_seconds": round(healthy, 6), "slow_seconds": round(slow, 6),
            "current_seconds": round(after[-1].median_seconds, 6) if after else None,
            "band_ratio": RECOVERY_BAND, "given_back_ratio": _given_back(after, slow, healthy),
            "recovered": start is not None,
            "recovered_from_step": after[start].first_step if start is not None else None,
            "summaries_after": len(after), "accelerator_hours": round(hours, 6),
            "onset_after_step": before[k - 1].last_step if k < len(before) else None,
            "onset_at": onset_at, "seconds_to_detect": detect}


def _given_back(after: Sequence[Summary], slow: float, healthy: float) -> float | None:
    """The share of the slowdown the last summary gave back (1.0: the healthy step, 0.0: still slow)."""
    if not after or slow <= healthy:
        return None
    return round((slow - after[-1].median_seconds) / (slow - healthy), 3)


def _series(c: sa.Connection, run: str, world: int) -> list[Summary]:
    return [Summary(s.first_step, s.last_step, s.median_seconds, s.at, world) for s in c.execute(
        sa.select(steps).where(steps.c.job_id == run).order_by(steps.c.first_step))]


def _inputs(c: sa.Connection, i: Any) -> tuple[list[Summary], list[Summary], float, float | None] | None:
    """The issue's series before its first window and after its last (across restarts), its slow step
    and its first window's opening; None while something is missing."""
    first_pk = next((h["window"] for h in i["history"] if "window" in h), i["last_window_pk"])
    first = c.execute(sa.select(windows.c.job_id, windows.c.start_step, windows.c.window_opened_at)
                      .where(windows.c.pk == first_pk)).first()
    last = c.execute(sa.select(windows.c.job_id, windows.c.end_step).where(windows.c.pk == i["last_window_pk"])
                     ).first()
    body = c.execute(sa.select(diagnoses.c.body).where(diagnoses.c.window_pk == i["last_window_pk"])).scalar()
    if first is None or last is None or body is None:
        return None
    cols = (jobs.c.id, jobs.c.name, jobs.c.world_size, jobs.c.first_seen)
    runs = {r.id: r for r in c.execute(sa.select(*cols).where(jobs.c.id.in_((first.job_id, last.job_id))))}
    if first.job_id not in runs or last.job_id not in runs:
        return None
    lrun = runs[last.job_id]
    # up to the window's first step: the summary it starts in holds the steps that made the detector fire
    before = [s for s in _series(c, first.job_id, runs[first.job_id].world_size) if s.first_step < first.start_step]
    after = [s for s in _series(c, last.job_id, lrun.world_size) if s.first_step >= last.end_step]
    later = sa.select(*cols).where(jobs.c.name == lrun.name, jobs.c.id != lrun.id, jobs.c.first_seen > lrun.first_seen)
    for r in c.execute(later.order_by(jobs.c.first_seen)):
        after += _series(c, r.id, r.world_size)          # the job restarted: follow it
    slow = json.loads(gzip.decompress(body))["windows"][0]["steps"]["during_median_seconds"]
    return before, after, float(slow or 0.0), first.window_opened_at


def assess(eng: sa.Engine, now: float | None = None) -> list[int]:
    """Measure every open issue; close those whose job came back as recovered. The ids it closed."""
    now = time.time() if now is None else now
    closed = []
    with reading(eng) as c:
        open_ = c.execute(sa.select(issues).where(issues.c.state.in_(OPEN_STATES))
                          ).mappings().all()
    for i in open_:
        with reading(eng) as c:
            got = _inputs(c, i)
        m = measure(*got) if got is not None else None
        if m is None or m == i["recovery"]:
            continue
        with writing(eng) as c:
            c.execute(issues.update().where(issues.c.id == i["id"]).values(recovery=m))
        if m["recovered"]:
            way = f"{m['given_back_ratio']:.0%} of the way; " if m["given_back_ratio"] is not None else ""
            transition(eng, i["id"], "recovered", "eroica", why=(
                f"step time {m['current_seconds']:.3f} s back from the slow {m['slow_seconds']:.3f} s to the healthy "
                f"{m['healthy_seconds']:.3f} s ({way}back is within {RECOVERY_BAND:.0%} of healthy or "
                f"{GIVEN_BACK:.0%} of the way) from step {m['recovered_from_step']}"), now=now)
            closed.append(int(i["id"]))
    return closed
