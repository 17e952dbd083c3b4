"""Whole-window hardware signals of a rank beside its peers, and the CPU load of its host.

Signals are read once per window into a `SignalTable` (one array per signal over the ranks), so
a suspect is compared with 100,000 peers by one median, not 100,000 attribute reads. When a one-off
spike step was left out of the comparison (engine/spikes.py), a signal is taken over the kept steps
only, from the per-step values the collector keeps, so a 9 s stall in one step does not dilute (or
fake) the signals of the other nine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eroica.engine.facts import Fact, HardwareSignal, HostCpuLoad, JobSlowdown
from eroica.schema.signals import SIGNALS

if TYPE_CHECKING:
    from eroica.engine.columns import WindowColumns

#: the signals stated as `hw_signal` facts, in the catalog's order (eroica.schema.signals: unit, source, range);
#: the stored column layout follows this order
HW_SIGNALS = tuple(s.name for s in SIGNALS if s.stated_as == "hw_signal" and s.scope != "NVML")
#: NVML signals (HardwareSummary.gpu), compared like the others when the ranks have GPUs
GPU_SIGNALS = tuple(s.name for s in SIGNALS if s.stated_as == "hw_signal" and s.scope == "NVML")
#: discrete hardware states: a rank whose link runs below its peers' is stated even when it is not late
#: (a degraded link slows every rank of a collective alike, so no rank stands out in busy time)
STATE_SIGNALS = ("gpu_nvlink_links_active", "gpu_pcie_width", "gpu_pcie_gen")
LARGE_GROUP = 64    # from this many members, leave-one-out statistics equal the whole group's


class SignalTable:
    """Each hardware signal of each rank of a window as one array over the window's rows (NaN where
    a rank has none).

    `column(sig, keep)` is the whole-window value, or, when a spike step was left out (`keep` has
    a False), the time-weighted mean over the kept steps of the collector's per-step values, for
    ranks that have one per step; cached per keep."""

    def __init__(self, cols: WindowColumns) -> None:
        self.cols = cols
        self.ranks = cols.ranks
        self.row = cols.row
        self.hosts = cols.hosts()
        self._cache: dict[tuple[str, bytes], np.ndarray] = {}

    def rows(self, ranks: list[int]) -> np.ndarray:
        return np.array([self.row[r] for r in ranks], dtype=int)

    def column(self, sig: str, keep: np.ndarray | None = None) -> np.ndarray:
        whole = self.cols.signals[sig]
        if keep is None or keep.all() or sig not in self.cols.per_step_signals:
            return whole
        tag = np.packbits(keep).tobytes() + len(keep).to_bytes(4, "little")
        col = self._cache.get((sig, tag))
        if col is None:
            n = len(keep)
            ps = self.cols.per_step_signals[sig]
            ok = (self.cols.per_step_len[sig] == n) & (self.cols.n_steps == n)
            if ps.shape[1] < n or not ok.any():
                col = whole
            else:
                v = ps[:, :n]
                kept = keep[None, :] & ~np.isnan(v)
                dur = self.cols.step[:, :n] * kept
                wt = dur.sum(axis=1)
                num = np.where(kept, np.nan_to_num(v) * dur, 0.0).sum(axis=1)
                use = ok & kept.any(axis=1) & (wt > 0)
                col = np.where(use, num / np.where(use, wt, 1.0), whole)
            self._cache[(sig, tag)] = col
        return col

    def value(self, sig: str, rank: int, keep: np.ndarray | None = None) -> float | None:
        v = self.column(sig, keep)[self.row[rank]]
        return None if np.isnan(v) else float(v)


def _median(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else None


def hw_signals(table: SignalTable, rank: int, peers: np.ndarray, keep: np.ndarray | None = None,
               signals: tuple[str, ...] = (*HW_SIGNALS, *GPU_SIGNALS),
               medians: dict[str, float | None] | None = None) -> list[Fact]:
    """`rank`'s signals beside the median of `peers` (table rows); `medians` caches the peers'
    medians when the same peers serve several suspects (a large group)."""
    out: list[Fact] = []
    for sig in signals:
        v = table.value(sig, rank, keep)
        if v is None:
            continue
        if medians is not None and sig in medians:
            med = medians[sig]
        else:
            med = _median(table.column(sig, keep)[peers])
            if medians is not None:
                medians[sig] = med
        if med is None:
            continue
        out.append(
            HardwareSignal(
                rank=rank, signal=sig, value=round(v, 4), peer_median=round(med, 4),
                delta=round(v - med, 4), ratio_to_median=round(cap_ratio(v, med), 4),
            )
        )
    return out


def cap_ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1000.0 if a > 0 else 1.0
    return float(min(a / b, 1000.0))


def host_cpu_facts(table: SignalTable, rank: int, keep: np.ndarray | None = None) -> list[Fact]:
    """The busy cores of `rank`'s host, less what the job's reporting ranks on it use themselves."""
    i = table.row[rank]
    host = table.cols.hostname[i]
    on_host = table.hosts[host]
    cores = int(table.cols.cores[i])
    utils = table.column("system_cpu_util_ratio", keep)[on_host]
    utils = utils[~np.isnan(utils)]
    jobs = table.column("process_cpu_cores", keep)[on_host]
    if not cores or not len(utils) or np.isnan(jobs).any():
        return []
    busy = float(np.median(utils)) * cores
    job = float(jobs.sum())
    return [HostCpuLoad(rank=rank, host=host, cores_total=cores, busy_cores=round(busy, 4), job_cores=round(job, 4),
                        other_cores=round(max(busy - job, 0.0), 4), busy_ratio=round(busy / cores, 4),
                        ranks_on_host=len(on_host))]


def job_slowdown(baseline_seconds: float | None, rank: int, suspects: set[int],
                 step_seconds: float) -> JobSlowdown | None:
    """The job's step over the window against the detector's baseline, stated on `rank`."""
    if not baseline_seconds or step_seconds <= 0:
        return None
    b = baseline_seconds
    return JobSlowdown(
        rank=rank, step_seconds=round(step_seconds, 6), baseline_step_seconds=round(b, 6),
        step_ratio_to_baseline=round(step_seconds / b, 4) if b > 0 else 1.0,
        excess_step_ratio=round(max(step_seconds - b, 0.0) / step_seconds, 4), ranks_standing_out=len(suspects))


def baseline_step(cols: WindowColumns, rows: np.ndarray) -> float | None:
    """The median of the ranks' step time before the window (the detector's baseline)."""
    base = cols.baseline[rows]
    base = base[~np.isnan(base) & (base != 0)]
    return float(np.median(base)) if len(base) else None


def low_states(table: SignalTable, rows: np.ndarray) -> dict[int, list[str]]:
    """Ranks with a GPU link state below their peers' median, and which states."""
    out: dict[int, list[str]] = {}
    for sig in STATE_SIGNALS:
        col = table.column(sig)[rows]
        have = ~np.isnan(col)
        vals, idx = col[have], rows[have]
        if len(vals) >= LARGE_GROUP:
            low = np.flatnonzero(vals < float(np.median(vals)))
        else:
            low = np.array([j for j in range(len(vals)) if len(vals) > 1
                            and vals[j] < float(np.median(np.delete(vals, j)))], dtype=int)
        for j in low:
            out.setdefault(table.ranks[int(idx[j])], []).append(sig)
    return out


CPU_WAIT_OUTLIER_DELTA = 0.15   # a rank waiting for a CPU this much more of the window than its peers


def standout_rank(table: SignalTable, rows: np.ndarray, signal: str, min_delta: float,
                  keep: np.ndarray | None = None) -> int | None:
    """The rank with the highest `signal`, when it stands `min_delta` above the others' median."""
    col = table.column(signal, keep)[rows]
    have = ~np.isnan(col)
    vals, idx = col[have], rows[have]
    if len(vals) < 3:
        return None
    j = int(np.argmax(vals))
    delta = float(vals[j]) - float(np.median(np.delete(vals, j)))
    return table.ranks[int(idx[j])] if delta >= min_delta else None


def cpu_wait_rank(table: SignalTable, rows: np.ndarray, keep: np.ndarray) -> int | None:
    """The rank that waits for a CPU most, when it stands out from the others' median."""
    return standout_rank(table, rows, "runqueue_wait_ratio", CPU_WAIT_OUTLIER_DELTA, keep)


CONTAINER_OTHERS_DELTA = 0.5   # cores used by other processes in a rank's container beyond its peers'


def crowded_rank(table: SignalTable, rows: np.ndarray) -> int | None:
    """The rank whose container (CPU cgroup) holds other processes using at least half a core more
    than its peers' containers do: something co-located competes with it, though it need not be late."""
    return standout_rank(table, rows, "cgroup_others_cpu_cores", CONTAINER_OTHERS_DELTA)


LOADER_BUSY_DELTA = 0.4        # a rank's loader workers busy this much more of their time than its peers'
LOADER_BUSY_MIN = 0.8          # ... and busy at least this much: the loader has no headroom left
LOADER_READS_DELTA = 1e7       # bytes/s a rank's loader workers read from disk beyond its peers'


def loader_ranks(table: SignalTable, rows: np.ndarray) -> set[int]:
    """Ranks whose loader workers work apart from their peers' though the rank need not be late
    (prefetching hides a slow loader until it has no headroom left): workers busy nearly all the
    time where the peers' mostly wait for work, or reading from disk what the peers' find in memory."""
    out = set()
    saturated = standout_rank(table, rows, "loader_worker_busy_ratio", LOADER_BUSY_DELTA)
    if saturated is not None and (table.value("loader_worker_busy_ratio", saturated) or 0.0) >= LOADER_BUSY_MIN:
        out.add(saturated)
    reading = standout_rank(table, rows, "loader_worker_disk_read_bytes_per_second", LOADER_READS_DELTA)
    if reading is not None:
        out.add(reading)
    return out


def outlier_facts(table: SignalTable, ranks: list[int], keep: np.ndarray, suspects: set[int],
                  step_seconds: float) -> list[Fact]:
    """Ranks that matter though none needs to be late: a co-located process can slow every rank of a
    host alike while one of them waits for a CPU far more than the others, or shares its container
    with the process (absolute evidence: the CPU that process uses); a rank's loader workers can work
    apart from their peers' while prefetching hides it; a degraded GPU link slows every rank of a
    collective alike. Each such rank gets the job's slowdown (to weigh it by) and,
    unless it is a suspect with all its signals already, the signals that single it out."""
    rows = table.rows(ranks)
    waiting = cpu_wait_rank(table, rows, keep)
    crowded = crowded_rank(table, rows)
    low = low_states(table, rows)
    out: list[Fact] = []
    cpu_ranks = {r for r in (waiting, crowded) if r is not None} | loader_ranks(table, rows)
    base = baseline_step(table.cols, rows) if low or cpu_ranks else None
    for r in sorted(set(low) | cpu_ranks):
        job = job_slowdown(base, r, suspects, step_seconds)
        if job is None:
            continue
        out.append(job)
        if r in suspects:
            continue
        others = rows[rows != table.row[r]]
        if r in cpu_ranks:
            out += hw_signals(table, r, others, keep) + host_cpu_facts(table, r, keep)
        else:
            out += hw_signals(table, r, others, signals=(*low[r], "gpu_nvlink_errors_per_second"))
    return out
