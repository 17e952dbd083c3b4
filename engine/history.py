"""The job's own history as evidence: what earlier windows of the same run already showed.

An SRE asks first "was it like this when the job was fine?". A rank that ran with a different
setting in an earlier window, when the job was clearly faster than now, shows that the setting was
there before the slowdown: the difference cannot explain a slowdown that began later. Each window
is compared with the windows of the same run that opened before it (by step number, never by wall
clock).
"""

from __future__ import annotations

from collections import Counter

from eroica.engine.facts import ConfigDeviation, EvidenceGap, Fact
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis


def _deviates(w: WindowData, a: PeerAnalysis, rank: int, key: str, value: str, peer_value: str) -> bool:
    """In window `w`, did `rank` run with key=value while the majority of its group ran peer_value?"""
    cols = w.columns
    row = cols.row.get(rank)
    if row is None or dict(cols.config[row]).get(key) != value:
        return False
    group = next((g.ranks for g in a.groups if rank in g.ranks), [])
    votes = Counter(dict(cols.config[cols.row[p]]).get(key) for p in group if p != rank and p in cols.row)
    total = sum(votes.values())
    return bool(total) and votes.get(peer_value, 0) > total / 2


FASTER_THEN_RATIO = 1.15     # the job's step now at least this many times the earlier window's


def _job_step(a: PeerAnalysis) -> float:
    steps = sorted(row.step_seconds for row in a.rows.values())
    return steps[len(steps) // 2] if steps else 0.0


def add_gaps(windows: list[WindowData], analyses: dict[str, PeerAnalysis]) -> None:
    """State what each suspect rank (a rank some fact names) could not collect, as facts. Changes
    `analyses[...].facts` in place."""
    for w in windows:
        a = analyses[w.window_id]
        suspects = {f.rank for f in a.facts}
        c = w.columns
        a.facts = [*a.facts, *(EvidenceGap(rank=r, source=src, reason=why[:200])
                               for r, gs in zip(c.ranks, c.gaps) if r in suspects
                               for src, why in sorted(set(gs)))]


def mark_history(windows: list[WindowData], analyses: dict[str, PeerAnalysis]) -> None:
    """Mark each window's config deviations that an earlier window of the run already showed while
    the job was clearly faster than now (`seen_while_healthy`). Changes `analyses[...].facts` in place."""
    order = sorted(windows, key=lambda w: int(w.columns.start_step.min()) if w.columns.ranks else 0)
    for k, w in enumerate(order):
        a = analyses[w.window_id]
        if not k or not any(isinstance(f, ConfigDeviation) for f in a.facts):
            continue
        now = _job_step(a)
        facts: list[Fact] = []
        for f in a.facts:
            if isinstance(f, ConfigDeviation):
                for e in order[:k]:
                    ea = analyses[e.window_id]
                    faster_then = 0 < _job_step(ea) * FASTER_THEN_RATIO <= now
                    if faster_then and _deviates(e, ea, f.rank, f.key, f.value, f.peer_value):
                        f = f.model_copy(update={"seen_while_healthy": True, "seen_in_window": e.window_id})
                        break
            facts.append(f)
        a.facts = facts
