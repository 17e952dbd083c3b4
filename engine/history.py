"""The job's own history as evidence: what earlier windows of the same run already showed.

An SRE asks first "was it like this when the job was fine?". A rank that ran with a different
setting in an earlier window, when the job was clearly faster than now, shows that the setting was
there before the slowdown: the difference cannot explain a slowdown that began later. Each window
is compared with the windows of the same run that opened before it (by step number, never by wall
clock).

Earlier windows are read as their `WindowHistory` summaries (eroica.schema.diagnosis), never as
their documents: a run directory's loader makes them as it goes, the service stores each with its
window's diagnosis, so a job's k-th window costs what its first did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eroica.engine.facts import ConfigDeviation, EvidenceGap, Fact
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis
from eroica.schema.diagnosis import (
    HISTORY_DEVIATIONS_MAX,
    ConfigSeen,
    Finding,
    FindingSeen,
    WindowHistory,
)

FASTER_THEN_RATIO = 1.15     # the job's step now at least this many times the earlier window's


def job_step_seconds(a: PeerAnalysis) -> float:
    steps = sorted(row.step_seconds for row in a.rows.values())
    return steps[len(steps) // 2] if steps else 0.0


def start_step(w: WindowData) -> int:
    return int(w.columns.start_step.min()) if w.columns.ranks else 0


def config_deviations(w: WindowData, a: PeerAnalysis) -> tuple[list[ConfigSeen], int]:
    """Each (rank, key) where the rank's value differs from what a strict majority of the rest of its
    peer group ran; at most HISTORY_DEVIATIONS_MAX, and how many more there were."""
    cols = w.columns
    out: list[ConfigSeen] = []
    dropped = 0
    for g in a.groups:
        members = [r for r in g.ranks if r in cols.row]
        if len(members) < 2 or len({cols.config[cols.row[r]] for r in members}) == 1:
            continue               # alone, or every member ran the same settings (a fleet's usual case)
        configs = {r: dict(cols.config[cols.row[r]]) for r in members}
        keys = sorted({k for c in configs.values() for k in c})
        others = len(members) - 1
        for key in keys:
            votes = Counter(c.get(key) for c in configs.values())
            top = votes.most_common(2)
            for r in members:
                value = configs[r].get(key)
                if value is None:
                    continue
                for peer_value, n in top:
                    n_others = n - (peer_value == value)
                    if peer_value is not None and peer_value != value and n_others > others / 2:
                        if len(out) < HISTORY_DEVIATIONS_MAX:
                            out.append(ConfigSeen(rank=r, key=key, value=str(value), peer_value=str(peer_value)))
                        else:
                            dropped += 1
    return out, dropped


def summarize(w: WindowData, a: PeerAnalysis, findings: Sequence[Finding]) -> WindowHistory:
    """What a later window needs of this one."""
    devs, dropped = config_deviations(w, a)
    seen = sorted({(f.root_cause, tuple(f.ranks)) for f in findings})
    return WindowHistory(window=w.window_id, start_step=start_step(w), job_step_seconds=round(job_step_seconds(a), 6),
                         config_deviations=devs, config_deviations_dropped=dropped,
                         findings=[FindingSeen(root_cause=c, ranks=list(r)) for c, r in seen])


def add_gaps(w: WindowData, a: PeerAnalysis) -> None:
    """State what each suspect rank (a rank some fact names) could not collect, as facts. Changes
    `a.facts` in place."""
    suspects = {f.rank for f in a.facts}
    c = w.columns
    a.facts = [*a.facts, *(EvidenceGap(rank=r, source=src, reason=why[:200])
                           for r, gs in zip(c.ranks, c.gaps) if r in suspects
                           for src, why in sorted(set(gs)))]


def mark_history(w: WindowData, a: PeerAnalysis, earlier: Sequence[WindowHistory]) -> None:
    """Mark the window's config deviations that an earlier window of the run (`earlier`: summaries,
    any order; only those that opened before `w` count) already showed while the job was clearly
    faster than now (`seen_while_healthy`, with the first such window). Changes `a.facts` in place."""
    mine = start_step(w)
    before = sorted((h for h in earlier if h.start_step < mine), key=lambda h: h.start_step)
    if not before or not any(isinstance(f, ConfigDeviation) for f in a.facts):
        return
    now = job_step_seconds(a)
    faster = [h for h in before if 0 < h.job_step_seconds * FASTER_THEN_RATIO <= now]
    seen: dict[tuple[int, str, str, str], str] = {}
    for h in reversed(faster):            # the earliest window wins
        for d in h.config_deviations:
            seen[(d.rank, d.key, d.value, d.peer_value)] = h.window
    facts: list[Fact] = []
    for f in a.facts:
        if isinstance(f, ConfigDeviation):
            where = seen.get((f.rank, f.key, f.value, f.peer_value))
            if where is not None:
                f = f.model_copy(update={"seen_while_healthy": True, "seen_in_window": where})
        facts.append(f)
    a.facts = facts
