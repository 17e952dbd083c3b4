"""The job's own history as evidence: what earlier windows of the same run already showed.

An SRE asks first "was it like this when the job was fine?". A rank that ran with a different
setting while the job was clearly faster than now had the setting before the slowdown: the
difference cannot explain a slowdown that began later (it may leave the rank more exposed to it,
and its findings say so). Two records answer it, by step number, never by wall clock: the
collector dates each setting (the step from which the rank ran with its value) and every window
carries the job's always-on step series before it, so a stretch of healthy steps after the
difference began is enough; and an earlier window of the same run that showed the difference
while the job was faster.

Earlier windows are read as their `WindowHistory` summaries (eroica.schema.diagnosis), never as
their documents: a run directory's loader makes them as it goes, the service stores each with its
window's diagnosis, so a job's k-th window costs what its first did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from eroica.engine.confidence import rescored
from eroica.engine.facts import ConfigDeviation, EvidenceGap, Fact
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis
from eroica.engine.report_data import job_series
from eroica.schema.diagnosis import (
    HISTORY_DEVIATIONS_MAX,
    ConfigSeen,
    Finding,
    FindingSeen,
    WindowHistory,
)

FASTER_THEN_RATIO = 1.15     # the job's step now at least this many times the earlier window's
PAUSE_RATIO = 4.0            # a step this many times the job's median step is a pause
AS_LONG_RATIO = 0.5          # an earlier pause at least this share of the window's (the detector's "by design")
IN_PAUSES_RATIO = 0.8        # a finding whose function spent this share of its window time in standing pauses
STANDING_FACTOR = 0.5        # what such a finding keeps of its confidence: below a finding's 0.5
WARMUP_STEPS = 10            # the detector's default warm-up: a first step's compilation is no pause to compare
HEALTHY_STRETCH_STEPS = 12   # the first steps after a difference began: their median FASTER_THEN_RATIO faster


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
    return with_findings(WindowHistory(window=w.window_id, start_step=start_step(w),
                                       job_step_seconds=round(job_step_seconds(a), 6), config_deviations=devs,
                                       config_deviations_dropped=dropped), findings)


def with_findings(h: WindowHistory, findings: Sequence[Finding]) -> WindowHistory:
    """A window's summary with what its rules found."""
    seen = sorted({(f.root_cause, tuple(f.ranks)) for f in findings})
    return h.model_copy(update={"findings": [FindingSeen(root_cause=c, ranks=list(r)) for c, r in seen]})


def add_gaps(w: WindowData, a: PeerAnalysis) -> None:
    """State what each suspect rank (a rank some fact names) could not collect, as facts. Changes
    `a.facts` in place."""
    suspects = {f.rank for f in a.facts}
    c = w.columns
    a.facts = [*a.facts, *(EvidenceGap(rank=r, source=src, reason=why[:200])
                           for r, gs in zip(c.ranks, c.gaps) if r in suspects
                           for src, why in sorted(set(gs)))]


def mark_history(w: WindowData, a: PeerAnalysis, earlier: Sequence[WindowHistory]) -> None:
    """Date the window's config deviations (`since_step`) and mark those present while the job was
    clearly faster than now (`seen_while_healthy`): a stretch of the window's own step series after
    the difference began (`healthy_stretch`), else an earlier window of the run (`earlier`: summaries,
    any order; only those that opened before `w` count) that showed it. Changes `a.facts` in place."""
    if not any(isinstance(f, ConfigDeviation) for f in a.facts):
        return
    mine = start_step(w)
    before = sorted((h for h in earlier if h.start_step < mine), key=lambda h: h.start_step)
    now = job_step_seconds(a)
    faster = [h for h in before if 0 < h.job_step_seconds * FASTER_THEN_RATIO <= now]
    seen: dict[tuple[int, str, str, str], str] = {}
    for h in reversed(faster):            # the earliest window wins
        for d in h.config_deviations:
            seen[(d.rank, d.key, d.value, d.peer_value)] = h.window
    series = _series_before(w)
    facts: list[Fact] = []
    for f in a.facts:
        if isinstance(f, ConfigDeviation):
            since = difference_since(w, f)
            update: dict[str, object] = {"since_step": since}
            stretch = healthy_stretch(series, since, now) if since is not None else None
            if stretch is not None:
                update |= {"seen_while_healthy": True, "healthy_from_step": stretch[0],
                           "healthy_to_step": stretch[1], "healthy_step_seconds": round(stretch[2], 6)}
            elif (where := seen.get((f.rank, f.key, f.value, f.peer_value))) is not None:
                update |= {"seen_while_healthy": True, "seen_in_window": where}
            f = f.model_copy(update=update)
        facts.append(f)
    a.facts = facts


def difference_since(w: WindowData, d: ConfigDeviation) -> int | None:
    """The step from which the rank and its peers held the values they differ by: the later of the
    rank's own since-step and the median of those of the ranks holding the peer value. None when the
    collector did not date them."""
    c = w.columns
    if d.rank not in c.row:
        return None
    mine = dict(c.config_since[c.row[d.rank]]).get(d.key)
    peers = [s for i, r in enumerate(c.ranks) if r != d.rank and dict(c.config[i]).get(d.key) == d.peer_value
             and (s := dict(c.config_since[i]).get(d.key)) is not None]
    if mine is None or not peers:
        return None
    return max(int(mine), int(np.median(peers)))


def _series_before(w: WindowData) -> tuple[np.ndarray, np.ndarray]:
    """The job's always-on step series before the window (median over ranks) and each step's number."""
    c = w.columns
    before = job_series(c.before, c.before_len, True) if c.ranks else np.zeros(0)
    return before, np.arange(len(before)) + start_step(w) - len(before)


def healthy_stretch(series: tuple[np.ndarray, np.ndarray], since: int,
                    now: float) -> tuple[int, int, float] | None:
    """The first HEALTHY_STRETCH_STEPS steps of the series after `since` (and the warm-up), when their
    median step was at least FASTER_THEN_RATIO faster than now: (first step, last step, that median);
    None otherwise. One stretch, not the fastest of many: on a noisy host some stretch of a slow job
    is always fast. "Now" is the lower of the window's step and the last steps before it, so a
    window's own overhead does not make the job's past look faster."""
    before, numbers = series
    k = HEALTHY_STRETCH_STEPS
    if len(before) >= k:
        now = min(now, float(np.median(before[-k:])))
    keep = numbers >= max(since, WARMUP_STEPS)
    values, steps = before[keep][:k], numbers[keep][:k]
    if len(values) < k or now <= 0:
        return None
    level = float(np.median(values))
    if level <= 0 or level * FASTER_THEN_RATIO > now:
        return None
    return int(steps[0]), int(steps[-1]), level


def mark_susceptible(a: PeerAnalysis, findings: Sequence[Finding]) -> list[Finding]:
    """Say on each finding of a rank that ran with a difference while the job was healthy that the
    difference is there: not what began the slowdown, though it may leave the rank more exposed."""
    present: dict[int, list[ConfigDeviation]] = {}
    for f in a.facts:
        if isinstance(f, ConfigDeviation) and f.seen_while_healthy:
            present.setdefault(f.rank, []).append(f)
    out: list[Finding] = []
    for finding in findings:
        devs = [d for r in finding.ranks for d in present.get(r, [])]
        if devs and finding.root_cause != "framework_config":
            notes = [f"{d.evidence()}; {d.while_healthy()}: not what began this slowdown, though it may leave "
                     "the rank more exposed to it" for d in devs[:3]]
            finding = finding.model_copy(update={"evidence": [*finding.evidence, *notes]})
        out.append(finding)
    return out


def standing_pauses(w: WindowData) -> tuple[np.ndarray, int | None]:
    """The window's pauses (steps PAUSE_RATIO times its median step) that the job made from the start:
    its first pause after its warm-up in its always-on step series was at least AS_LONG_RATIO as long,
    and it paused as often (the detector's "by design"). A pause that became longer shows shorter ones
    first, even when the window opens after several long ones. The mask over the window's steps and
    that first pause's step; an empty mask when the window has no pause or the job made none like it.
    The series holds the detector's last HISTORY_STEPS steps: a pause long for longer than that is read
    as the job's design."""
    c = w.columns
    none = np.zeros(0, dtype=bool), None
    if not c.ranks:
        return none
    during = job_series(c.step, c.n_steps, False)
    before, numbers = _series_before(w)
    keep = numbers >= WARMUP_STEPS
    before, numbers = before[keep], numbers[keep]
    if len(during) < 5 or len(before) < 10:
        return none
    level_d, level_b = float(np.median(during)), float(np.median(before))
    if level_d <= 0 or level_b <= 0:
        return none
    pauses = during > PAUSE_RATIO * level_d
    earlier = before > PAUSE_RATIO * level_b
    if not pauses.any() or not earlier.any():
        return none
    first_pause = int(np.argmax(earlier))            # the job's first pause after its warm-up: what it always did
    as_long = before[first_pause] - level_b >= AS_LONG_RATIO * float((during[pauses] - level_d).min())
    expected = int(np.ceil(2 * earlier.sum() / len(before) * len(during)))   # as often: twice the rate at most
    if not as_long or int(pauses.sum()) > max(1, expected):
        return none
    return pauses, int(numbers[first_pause])


def mark_standing(w: WindowData, findings: Sequence[Finding]) -> list[Finding]:
    """Lower each finding whose function spent IN_PAUSES_RATIO of its window time on its ranks in
    standing pauses (`standing_pauses`) to STANDING_FACTOR of its confidence, and say so: the cause is
    present, and what it costs is shown, but the job paid it from its start."""
    mask, step = standing_pauses(w)
    if step is None:
        return list(findings)
    c = w.columns
    n = len(mask)
    out: list[Finding] = []
    for f in findings:
        cols = [k for k, (_, name) in enumerate(c.keys) if f.function is not None and name == f.function]
        rows = [c.row[r] for r in f.ranks if r in c.row]
        spent = c.per_step[np.ix_(rows, cols)][:, :, :n].sum(axis=(0, 1)) if cols and rows else np.zeros(n)
        total = float(spent.sum())
        if total <= 0 or float(spent[mask].sum()) < IN_PAUSES_RATIO * total:
            out.append(f)
            continue
        f = rescored(f, standing_ratio=STANDING_FACTOR, standing_step=step)
        out.append(f.model_copy(update={
            "summary": f"{f.summary} The job made the same pause from its start, as long (first at step {step}): "
                       "present by design, not this window's slowdown."}))
    return out
