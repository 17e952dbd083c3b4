"""What a report shows beyond the findings: the rank x function heatmap, the job's step series,
each culprit's hardware signature beside its peers' spread, and what each finding costs.

Built from the same pattern documents and peer analysis as the findings; bounded in size for
jobs of any width (the heatmap keeps the first ranks and aggregates the rest into percentile rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eroica.engine.columns import METRICS, WindowColumns
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis
from eroica.engine.signals import GPU_SIGNALS, HW_SIGNALS, SignalTable
from eroica.engine.spikes import kept_steps, scheduled_steps
from eroica.schema.diagnosis import (
    Finding,
    FindingCost,
    Heatmap,
    HeatmapRow,
    SignalComparison,
    StepSeries,
)

MAX_FUNCTIONS = 12          # heatmap columns
MAX_RANK_ROWS = 32          # heatmap rows shown one per rank; the others become percentile rows
AGGREGATE_FROM = 48         # more ranks than this: aggregate
SIGNAL_MIN_RELATIVE = 0.15  # a culprit's signal shown when it differs from the median by this much ...
MAX_SIGNALS = 8


def _spread(values: list[float]) -> tuple[float, float, float]:
    """The peers' 10th percentile, median and 90th percentile."""
    p10, med, p90 = np.percentile(values, [10, 50, 90])
    return float(p10), float(med), float(p90)


def _per_function(cols: WindowColumns, keep: np.ndarray) -> tuple[list[str], np.ndarray]:
    """[rank, function] mean critical seconds per kept step, functions as `category:name`, sorted;
    the window mean where a rank has other than the window's common number of steps."""
    names = [f"{c.value}:{n}" for c, n in cols.keys]
    order = sorted(range(len(names)), key=lambda j: names[j])
    n_r = cols.n_steps
    whole = cols.critical / np.maximum(n_r, 1)[:, None]
    if len(keep) and keep.any():
        kept = cols.per_step[:, :, : len(keep)][:, :, keep].mean(axis=2)
        mat = np.where((n_r == len(keep))[:, None], kept, whole)
    else:
        mat = whole
    return [names[j] for j in order], mat[:, order]


def heatmap(w: WindowData, analysis: PeerAnalysis) -> Heatmap | None:
    cols = w.columns
    ranks = cols.ranks
    if len(ranks) < 2:
        return None
    n = int(cols.n_steps.min())
    keep = kept_steps(cols.step[:, :n], scheduled_steps(cols.per_step[:, :, :n], cols.keys)) if n \
        else np.ones(0, dtype=bool)
    keys, mat = _per_function(cols, keep)
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


def shared_costs(findings: Sequence[Finding]) -> list[Finding]:
    """Findings in report order, each whose ranks a finding before it already costed marked as carrying
    that one's excess (`cost.same_excess_as`), so that costs summed over a window count each excess once."""
    first: dict[tuple[int, ...], str] = {}
    out = []
    for f in findings:
        key = tuple(sorted(f.ranks))
        if f.cost is not None and key in first:
            f = f.model_copy(update={"cost": f.cost.model_copy(update={"same_excess_as": first[key]})})
        elif f.cost is not None:
            first[key] = f.root_cause
        out.append(f)
    return out


def job_series(mat: np.ndarray, lens: np.ndarray, right: bool) -> np.ndarray:
    """The median over ranks of each of the last n steps, n the fewest any rank has (`right`: rows are
    right-aligned, else left-aligned with `lens` values each)."""
    n = int(lens.min()) if len(lens) else 0
    if n <= 0:
        return np.zeros(0)
    if right:
        tail = mat[:, mat.shape[1] - n:]
    else:
        tail = mat[np.arange(len(lens))[:, None], lens[:, None] - n + np.arange(n)]
    out: np.ndarray = np.median(tail, axis=0)
    return out


def step_series(w: WindowData) -> StepSeries | None:
    cols = w.columns
    if not cols.ranks:
        return None

    return StepSeries(
        before_seconds=[round(float(x), 6) for x in job_series(cols.before, cols.before_len, True)],
        during_seconds=[round(float(x), 6) for x in job_series(cols.step, cols.n_steps, False)],
        per_rank_before_seconds={str(r): round(float(b), 6) for r, b in zip(cols.ranks, cols.baseline)
                                 if not np.isnan(b)},
    )


def signature(table: SignalTable, rank: int) -> list[SignalComparison]:
    """The rank's hardware signals that stand apart from its peers' spread, largest first."""
    if rank not in table.row:
        return []
    i = table.row[rank]
    out: list[tuple[float, SignalComparison]] = []
    for sig in (*HW_SIGNALS, *GPU_SIGNALS):
        col = table.column(sig)
        v = col[i]
        peers = np.delete(col, i)
        peers = peers[~np.isnan(peers)]
        if np.isnan(v) or not len(peers):
            continue
        p10, med, p90 = _spread(peers)
        scale = max(abs(med), abs(p90 - p10), 1e-9)
        rel = abs(float(v) - med) / scale
        if rel >= SIGNAL_MIN_RELATIVE and not p10 <= v <= p90:
            out.append((rel, SignalComparison(signal=sig, value=round(float(v), 4), peer_median=round(med, 4),
                                              peer_p10=round(p10, 4), peer_p90=round(p90, 4))))
    out.sort(key=lambda x: -x[0])
    return [s for _, s in out[:MAX_SIGNALS]]


def function_signal(w: WindowData, cols: WindowColumns, rank: int, function: str | None) -> list[SignalComparison]:
    """The metric that matters for the finding's function (CPU rate, link bytes/s, SM clock) on
    the culprit beside the same function on its peers, and its duration per step."""
    if not function or rank not in w.docs:
        return []
    mine = next((f for f in w.docs[rank].functions if f.name == function), None)
    if mine is None:
        return []
    j = cols.keys.index((mine.category, mine.name))
    i = cols.row[rank]
    peers = cols.present[:, j].copy()
    peers[i] = False
    out = []
    n = max(len(w.docs[rank].step_times.during_seconds), 1)
    durs = (cols.critical[peers, j] / np.maximum(cols.n_steps[peers], 1)).tolist()
    if durs:
        p10, med, p90 = _spread(durs)
        out.append(SignalComparison(signal=f"{function}: s/step", value=round(mine.critical_seconds / n, 6),
                                    peer_median=round(med, 6), peer_p10=round(p10, 6), peer_p90=round(p90, 6)))
    if mine.metric is None or mine.metric_mean is None:
        return out
    same = peers & (cols.metric_code[:, j] == METRICS.index(mine.metric))
    vals = cols.metric_mean[same, j]
    if len(vals):
        p10, med, p90 = _spread(vals.tolist())
        out.append(SignalComparison(signal=f"{function}: {mine.metric.value}", value=mine.metric_mean,
                                    peer_median=round(med, 4), peer_p10=round(p10, 4), peer_p90=round(p90, 4)))
        # steady or bursty: the spread of the metric while the function runs (a capped link is steady)
        std, mean = cols.metric_std[same, j], cols.metric_mean[same, j]
        ok = ~np.isnan(std) & (mean != 0)
        cvs = (std[ok] / mean[ok]).tolist()
        if mine.metric_std is not None and mine.metric_mean and cvs:
            p10, med, p90 = _spread(cvs)
            out.append(SignalComparison(signal=f"{function}: {mine.metric.value} spread (std/mean)",
                                        value=round(mine.metric_std / mine.metric_mean, 4), peer_median=round(med, 4),
                                        peer_p10=round(p10, 4), peer_p90=round(p90, 4)))
    return out


def cost(f: Finding, step_seconds: float | None, world: int, before_seconds: float | None = None) -> FindingCost | None:
    """What the finding costs: the culprit's excess busy time, which every rank waits for; never more than
    the slowdown when the job ran faster before the window (a fix brings the step back to what it was, not
    below: the culprit's excess over peers that themselves waited can exceed it)."""
    if not step_seconds or step_seconds <= 0 or f.excess_seconds_per_step <= 0:
        return None
    ex = min(f.excess_seconds_per_step, step_seconds)
    if before_seconds is not None and 0 < before_seconds < step_seconds:
        ex = min(ex, step_seconds - before_seconds)
    return FindingCost(
        excess_seconds_per_step=round(ex, 6), step_seconds=round(step_seconds, 6),
        step_seconds_if_fixed=round(step_seconds - ex, 6), ranks_waiting_total=world,
        accelerator_hours_lost_per_hour=round(world * ex / step_seconds, 3),
        recovered_ratio=round(ex / step_seconds, 4),
    )


def add_report_data(findings: list[Finding], w: WindowData, analysis: PeerAnalysis,
                    step_seconds: float | None, before_seconds: float | None = None) -> list[Finding]:
    world = w.world_size or len(w.docs)
    cols = w.columns
    table = analysis.signals or SignalTable(cols)
    return [f.model_copy(update={"signals": (function_signal(w, cols, f.ranks[0], f.function)
                                             + signature(table, f.ranks[0])) if f.ranks else [],
                                 "cost": cost(f, step_seconds, world, before_seconds)}) for f in findings]
