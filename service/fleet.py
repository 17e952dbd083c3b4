"""Hosts that keep failing: a host named by confident hardware findings in several jobs is a fleet
problem, not a job problem. The ranking and the drain list (for the scheduler) come from issues
only, so one low-confidence finding never drains a host; the thresholds are validated settings."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from eroica.service.db import issues


def host_ranking(eng: sa.Engine, min_confidence: float = 0.5) -> list[dict[str, Any]]:
    """Every host a confident finding named: how many jobs and issues, which causes, when last."""
    with eng.connect() as c:
        rows = c.execute(sa.select(issues.c.job_id, issues.c.root_cause, issues.c.category, issues.c.hosts,
                                   issues.c.last_seen, issues.c.top_confidence)
                         .where(issues.c.top_confidence >= min_confidence)).all()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        for h in r.hosts:
            e = out.setdefault(h, {"host": h, "jobs": set(), "hardware_jobs": set(), "issues": 0, "root_causes": {},
                                   "last_seen": 0.0})
            e["jobs"].add(r.job_id)
            if r.category == "hardware":
                e["hardware_jobs"].add(r.job_id)
            e["issues"] += 1
            e["root_causes"][r.root_cause] = e["root_causes"].get(r.root_cause, 0) + 1
            e["last_seen"] = max(e["last_seen"], r.last_seen)
    ranked = [{**e, "jobs": len(e["jobs"]), "hardware_jobs": len(e["hardware_jobs"])} for e in out.values()]
    return sorted(ranked, key=lambda e: (-e["hardware_jobs"], -e["issues"], e["host"]))


def drain_list(eng: sa.Engine, min_jobs: int, min_confidence: float) -> list[dict[str, Any]]:
    """Hosts named by confident hardware findings in at least `min_jobs` jobs."""
    return [e for e in host_ranking(eng, min_confidence) if e["hardware_jobs"] >= min_jobs]
