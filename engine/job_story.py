"""A culprit over the job's life: what each window's verdicts say together.

An SRE reads a job's windows as one story before acting. The same rank and cause window after
window is chronic: it is the job's, and fixing it recovers every later hour. A cause that comes and
goes on the same rank is intermittent: something periodic (a neighbour's batch job, a shared
volume's busy hour). The same cause on a different rank each time is rotating: no rank is the
culprit; something they share is (storage, the fabric, a scheduler). Once and not since is
transient; once in the latest window is new. Only confident findings count, and only windows that
could be diagnosed: a window below the coverage floor says nothing either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from eroica.schema.diagnosis import CulpritSighting, CulpritStory, WindowDiagnosis

CONFIDENT = 0.5            # a finding at least this sure is a verdict (the reports' threshold)
HEALTHY_STEPS = 8          # steps in a row between two sightings, at the job's healthy step: it went away
HEALTHY_RATIO = 1.1        # ... their median within this of the step before the first sighting


def story(windows: Sequence[WindowDiagnosis]) -> list[CulpritStory]:
    """Each confident cause over `windows` (any order; read by start step), costliest first; [] for
    fewer than two diagnosable windows."""
    order = sorted((w for w in windows if w.diagnosable), key=lambda w: w.start_step)
    if len(order) < 2:
        return []
    by_cause: dict[str, list[tuple[int, CulpritSighting]]] = {}
    for i, w in enumerate(order):
        for f in w.findings:
            if f.confidence < CONFIDENT:
                continue
            seen = by_cause.setdefault(f.root_cause, [])
            if seen and seen[-1][0] == i:                 # one sighting per window: its surest finding
                continue
            cost = f.cost.excess_seconds_per_step if f.cost is not None and f.cost.same_excess_as is None else 0.0
            seen.append((i, CulpritSighting(window=w.window, start_step=w.start_step, ranks=list(f.ranks),
                                            confidence=round(f.confidence, 4),
                                            excess_seconds_per_step=round(max(cost, 0.0), 6))))
    out: list[CulpritStory] = []
    for cause, sightings in by_cause.items():
        rank_sets = {tuple(s.ranks) for _, s in sightings}
        if len(rank_sets) > 1 and not set.intersection(*(set(r) for r in rank_sets)):
            out.append(_story(cause, "rotating", sightings, len(order)))
            continue
        for ranks in sorted(rank_sets):
            mine = [(i, s) for i, s in sightings if tuple(s.ranks) == ranks]
            out.append(_story(cause, _kind([i for i, _ in mine], order), mine, len(order)))
    return sorted(out, key=lambda s: (-sum(x.excess_seconds_per_step for x in s.sightings), s.root_cause, s.ranks))


def _kind(at: list[int], order: list[WindowDiagnosis]) -> str:
    if len(at) == 1:
        return "new" if at[0] == len(order) - 1 else "transient"
    if at[-1] - at[0] + 1 != len(at):
        return "intermittent"            # a window without it between
    healthy = order[at[0]].steps.before_median_seconds
    return "intermittent" if healthy and any(went_away(order[i], order[j], healthy) for i, j in zip(at, at[1:])) \
        else "chronic"


def went_away(earlier: WindowDiagnosis, later: WindowDiagnosis, healthy_seconds: float) -> bool:
    """Did the job run at its healthy step between two windows? HEALTHY_STEPS steps in a row of the later
    window's always-on series, after the earlier window closed, with their median within HEALTHY_RATIO
    of `healthy_seconds` (the step before the cause was first seen)."""
    series = later.step_series.before_seconds if later.step_series is not None else []
    first = later.start_step - len(series)
    between = [x for k, x in enumerate(series) if first + k >= earlier.end_step]
    runs = [sorted(between[k:k + HEALTHY_STEPS]) for k in range(len(between) - HEALTHY_STEPS + 1)]
    return any(r[HEALTHY_STEPS // 2] <= healthy_seconds * HEALTHY_RATIO for r in runs)


def _story(cause: str, kind: str, sightings: list[tuple[int, CulpritSighting]], n: int) -> CulpritStory:
    first = sightings[0][0]
    seen = [s for _, s in sightings]
    ranks = sorted({r for s in seen for r in s.ranks})
    since = n - first
    costs = ", ".join(f"{s.excess_seconds_per_step * 1e3:.0f} ms" for s in seen)
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    what = {
        "chronic": f"on {who} in {len(seen)} windows in a row from step {seen[0].start_step}"
                   + ("" if sightings[-1][0] == n - 1 else f", not in the {n - 1 - sightings[-1][0]} since")
                   + ": it stays with the job, and a fix recovers every later hour",
        "intermittent": f"on {who} in {len(seen)} of the {since} windows from step {seen[0].start_step}, with the "
                        "job healthy between: it comes and goes (something periodic)",
        "rotating": f"on a different rank in turn ({' -> '.join(','.join(map(str, s.ranks)) for s in seen)}) in "
                    f"{len(seen)} of the {since} windows from step {seen[0].start_step}: no rank is the culprit; "
                    "look at what they share (storage, the fabric, a scheduler)",
        "transient": f"on {who} once (window {seen[0].window}), not in the {n - 1 - first} since",
        "new": f"on {who} in the latest window only (step {seen[0].start_step})",
    }[kind]
    return CulpritStory(root_cause=cause, ranks=ranks, kind=kind,
                        windows_seen_total=len(seen), windows_since_total=since, sightings=seen,
                        summary=f"{cause} {what}; cost a step: {costs}.")
