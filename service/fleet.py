"""Hosts that keep failing: a host named by confident hardware findings in several jobs is a fleet
problem, not a job problem. The ranking and the drain list (for the scheduler) come from issues
only, so one low-confidence finding never drains a host; the thresholds are validated settings."""

from __future__ import annotations

import statistics
from typing import Any

import sqlalchemy as sa

from eroica.service.db import issues, reading, windows


def host_ranking(eng: sa.Engine, min_confidence: float = 0.5) -> list[dict[str, Any]]:
    """Every host a confident finding named: how many jobs and issues, which causes, which of its
    devices hardware findings named, when last."""
    with reading(eng) as c:
        rows = c.execute(sa.select(issues.c.job_id, issues.c.root_cause, issues.c.category, issues.c.hosts,
                                   issues.c.last_seen, issues.c.top_confidence, issues.c.devices)
                         .where(issues.c.top_confidence >= min_confidence)).all()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        for h in r.hosts:
            e = out.setdefault(h, {"host": h, "jobs": set(), "hardware_jobs": set(), "issues": 0, "root_causes": {},
                                   "last_seen": 0.0, "devices": {}})
            e["jobs"].add(r.job_id)
            if r.category == "hardware":
                e["hardware_jobs"].add(r.job_id)
                for d in r.devices or []:          # the host's devices hardware findings named, and how often
                    if d.startswith(h + "/"):
                        dev = d.removeprefix(h + "/")
                        e["devices"][dev] = e["devices"].get(dev, 0) + 1
            e["issues"] += 1
            e["root_causes"][r.root_cause] = e["root_causes"].get(r.root_cause, 0) + 1
            e["last_seen"] = max(e["last_seen"], r.last_seen)
    ranked = [{**e, "jobs": len(e["jobs"]), "hardware_jobs": len(e["hardware_jobs"])} for e in out.values()]
    return sorted(ranked, key=lambda e: (-e["hardware_jobs"], -e["issues"], e["host"]))


def drain_list(eng: sa.Engine, min_jobs: int, min_confidence: float) -> list[dict[str, Any]]:
    """Hosts named by confident hardware findings in at least `min_jobs` jobs."""
    return [e for e in host_ranking(eng, min_confidence) if e["hardware_jobs"] >= min_jobs]


def week_summary(eng: sa.Engine, since: float, until: float) -> dict[str, Any]:
    """For a period: how many slowdowns (issues opened), how fast they were detected (the fault's
    onset in the step series to the window's opening), localized (the window's first open to its
    stored diagnosis), fixed (diagnosis to recovery), and the accelerator-hours fixing them gave back."""
    with reading(eng) as c:
        opened = c.execute(sa.select(issues).where(issues.c.first_seen >= since, issues.c.first_seen < until)
                           ).mappings().all()
        wins = c.execute(sa.select(windows.c.window_opened_at, windows.c.diagnosed_at).where(
            windows.c.diagnosed_at >= since, windows.c.diagnosed_at < until,
            windows.c.window_opened_at.is_not(None))).all()
    localize = [w.diagnosed_at - w.window_opened_at for w in wins]
    detect = [float(i["recovery"]["seconds_to_detect"]) for i in opened
              if (i["recovery"] or {}).get("seconds_to_detect") is not None]
    fixed = [i for i in opened if i["state"] == "recovered"]
    mitigate = [next(h["at"] for h in reversed(i["history"]) if h["state"] == "recovered") - i["first_seen"]
                for i in fixed]

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 3) if xs else None

    return {"since": since, "until": until, "slowdowns": len(opened),
            "hardware": sum(i["category"] == "hardware" for i in opened),
            "median_seconds_to_detect": med(detect), "issues_with_onset": len(detect),
            "median_seconds_to_localize": med(localize), "windows_localized": len(localize),
            "fixed": len(fixed), "false_positives": sum(i["state"] == "false_positive" for i in opened),
            "median_seconds_to_mitigate": med(mitigate),
            "accelerator_hours_recovered": round(sum(float((i["recovery"] or {}).get("accelerator_hours", 0))
                                                     for i in fixed), 6)}
