"""What a report shows beyond the findings: the rank x function heatmap, the job's step series,
each culprit's hardware signature beside its peers' spread, and what each finding costs.

Built from the same pattern documents and peer analysis as the findings; bounded in size for
jobs of any width (the heatmap keeps the first ranks and aggregates the rest into percentile rows).
"""

from __future__ import annotations

import numpy as np

from eroica.collector.facts import PatternsDoc
from eroica.engine.diagnosis import (
    Finding,
    FindingCost,
    Heatmap,
    HeatmapRow,
    SignalComparison,
    StepSeries,
)
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis
from eroica.engine.signals import GPU_SIGNALS, HW_SIGNALS, signal_value
from eroica.engine.spikes import kept_steps

MAX_FUNCTIONS = 12          # heatmap columns
MAX_RANK_ROWS = 32          # heatmap rows shown one per rank; the others become percentile rows
AGGREGATE_FROM = 48         # more ranks than this: aggregate
SIGNAL_MIN_RELATIVE = 0.15  # a culprit's signal shown when it differs from the median by this much ...
MAX_SIGNALS = 8


def _spread(values: list[float]) -> tuple[float, float, float]:
    """The peers' 10th percentile, median and 90th percentile."""
    p10, med, p90 = np.percentile(values, [10, 50, 90])
    return float(p10), float(med), float(p90)


def _per_function(doc: PatternsDoc, keep: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    n = len(doc.step_times.during_seconds)
    for f in doc.functions:
        v = np.asarray(f.critical_per_step_seconds, dtype=float)
        k = f"{f.category.value}:{f.name}"
        if len(v) == n == len(keep) and keep.any():
            out[k] = out.get(k, 0.0) + float(v[keep].mean())
        else:
            out[k] = out.get(k, 0.0) + f.critical_seconds / max(n, 1)
    return out


def heatmap(w: WindowData, analysis: PeerAnalysis) -> Heatmap | None:
    ranks = sorted(w.docs)
    if len(ranks) < 2:
        return None
    n = min(len(w.docs[r].step_times.during_seconds) for r in ranks)
    step = np.array([w.docs[r].step_times.during_seconds[:n] for r in ranks]) if n else np.zeros((len(ranks), 0))
    keep = kept_steps(step) if n else np.ones(0, dtype=bool)
    per = {r: _per_function(w.docs[r], keep) for r in ranks}
    keys = sorted({k for r in ranks for k in per[r]})
    mat = np.array([[per[r].get(k, 0.0) for k in keys] for r in ranks])
    med = np.median(mat, axis=0)
    dev = mat - med
    # the functions that deviate most on some rank (communication too: that is where victims wait)
    top = sorted(range(len(keys)), key=lambda j: -float(np.max(np.abs(dev[:, j]))))[:MAX_FUNCTIONS]
    top.sort(key=lambda j: -float(np.max(dev[:, j])))
    busy = {r: analysis.rows[r].busy_seconds for r in ranks if r in analysis.rows}
    bmed = float(np.median(list(busy.values()))) if busy else 0.0
    order = sorted(range(len(ranks)), key=lambda i: -(busy.get(ranks[i], bmed) - bmed))
    shown = order if len(ranks) <= AGGREGATE_FROM else order[:MAX_RANK_ROWS]
    rows = [HeatmapRow(label=f"rank {ranks[i]}", rank=ranks[i],
                       busy_excess_seconds=round(busy.get(ranks[i], bmed) - bmed, 6),
                       values_seconds=[round(float(dev[i, j]), 6) for j in top]) for i in shown]
    rest = order[len(shown):]
    if rest:
        sub = dev[rest][:, top]
        bx = np.array([busy.get(ranks[i], bmed) - bmed for i in rest])
        for q, name in ((50, "p50"), (90, "p90"), (100, "max")):
            rows.append(HeatmapRow(label=f"other {len(rest)} ranks: {name}", rank=None,
                                   busy_excess_seconds=round(float(np.percentile(bx, q)), 6),
                                   values_seconds=[round(float(x), 6) for x in np.percentile(sub, q, axis=0)]))
    return Heatmap(functions=[keys[j] for j in top], peer_median_seconds=[round(float(med[j]), 6) for j in top],
                   rows=rows, aggregated_ranks_total=len(rest))


def step_series(w: WindowData) -> StepSeries | None:
    docs = list(w.docs.values())
    if not docs:
        return None

    def med_series(seqs: list[list[float]]) -> list[float]:
        n = min((len(s) for s in seqs), default=0)
        return [round(float(np.median([s[-n + i] if n else 0 for s in seqs])), 6) for i in range(n)]

    return StepSeries(
        before_seconds=med_series([d.step_times.before_seconds for d in docs]),
        during_seconds=med_series([d.step_times.during_seconds for d in docs]),
        per_rank_before_seconds={str(r): round(d.step_times.baseline_median_seconds, 6) for r, d in
                                 sorted(w.docs.items()) if d.step_times.baseline_median_seconds is not None},
    )


def signature(w: WindowData, rank: int) -> list[SignalComparison]:
    """The rank's hardware signals that stand apart from its peers' spread, largest first."""
    doc = w.docs.get(rank)
    if doc is None:
        return []
    out: list[tuple[float, SignalComparison]] = []
    for sig in (*HW_SIGNALS, *GPU_SIGNALS):
        v = signal_value(doc, sig)
        peers = [x for r, d in w.docs.items() if r != rank and (x := signal_value(d, sig)) is not None]
        if v is None or not peers:
            continue
        p10, med, p90 = _spread(peers)
        scale = max(abs(med), abs(p90 - p10), 1e-9)
        rel = abs(float(v) - med) / scale
        if rel >= SIGNAL_MIN_RELATIVE and not p10 <= v <= p90:
            out.append((rel, SignalComparison(signal=sig, value=round(float(v), 4), peer_median=round(med, 4),
                                              peer_p10=round(p10, 4), peer_p90=round(p90, 4))))
    out.sort(key=lambda x: -x[0])
    return [s for _, s in out[:MAX_SIGNALS]]


def function_signal(w: WindowData, rank: int, function: str | None) -> list[SignalComparison]:
    """The metric that matters for the finding's function (CPU rate, link bytes/s, SM clock) on
    the culprit beside the same function on its peers, and its duration per step."""
    if not function or rank not in w.docs:
        return []

    def find(doc: PatternsDoc):  # type: ignore[no-untyped-def]
        return next((f for f in doc.functions if f.name == function), None)

    mine = find(w.docs[rank])
    if mine is None:
        return []
    out = []
    peers = [p for r, d in w.docs.items() if r != rank and (p := find(d)) is not None]
    n = max(len(w.docs[rank].step_times.during_seconds), 1)
    durs = [p.critical_seconds / max(len(w.docs[r].step_times.during_seconds), 1)
            for r, d in w.docs.items() if r != rank and (p := find(d)) is not None]
    if durs:
        p10, med, p90 = _spread(durs)
        out.append(SignalComparison(signal=f"{function}: s/step", value=round(mine.critical_seconds / n, 6),
                                    peer_median=round(med, 6), peer_p10=round(p10, 6), peer_p90=round(p90, 6)))
    vals = [p.metric_mean for p in peers if p.metric_mean is not None and p.metric == mine.metric]
    if mine.metric is not None and mine.metric_mean is not None and vals:
        p10, med, p90 = _spread(vals)
        out.append(SignalComparison(signal=f"{function}: {mine.metric.value}", value=mine.metric_mean,
                                    peer_median=round(med, 4), peer_p10=round(p10, 4), peer_p90=round(p90, 4)))
        # steady or bursty: the spread of the metric while the function runs (a capped link is steady)
        cvs = [p.metric_std / p.metric_mean for p in peers
               if p.metric == mine.metric and p.metric_std is not None and p.metric_mean]
        if mine.metric_std is not None and mine.metric_mean and cvs:
            p10, med, p90 = _spread(cvs)
            out.append(SignalComparison(signal=f"{function}: {mine.metric.value} spread (std/mean)",
                                        value=round(mine.metric_std / mine.metric_mean, 4), peer_median=round(med, 4),
                                        peer_p10=round(p10, 4), peer_p90=round(p90, 4)))
    return out


def cost(f: Finding, step_seconds: float | None, world: int) -> FindingCost | None:
    if not step_seconds or step_seconds <= 0 or f.excess_seconds_per_step <= 0:
        return None
    ex = min(f.excess_seconds_per_step, step_seconds)
    return FindingCost(
        excess_seconds_per_step=round(ex, 6), step_seconds=round(step_seconds, 6),
        step_seconds_if_fixed=round(step_seconds - ex, 6), ranks_waiting_total=world,
        accelerator_hours_lost_per_hour=round(world * ex / step_seconds, 3),
        recovered_ratio=round(ex / step_seconds, 4),
    )


def enrich(findings: list[Finding], w: WindowData, step_seconds: float | None) -> list[Finding]:
    world = w.world_size or len(w.docs)
    return [f.model_copy(update={"signals": (function_signal(w, f.ranks[0], f.function) + signature(w, f.ranks[0]))
                                 if f.ranks else [],
                                 "cost": cost(f, step_seconds, world)}) for f in findings]
