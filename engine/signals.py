"""Whole-window hardware signals of a rank beside its peers, and the CPU load of its host.

When a one-off spike step was left out of the comparison (engine/spikes.py), a signal is taken over
the kept steps only, from the per-step values the collector keeps, so a 9 s stall in one step does
not dilute (or fake) the signals of the other nine.
"""

from __future__ import annotations

import numpy as np

from eroica.collector.facts import PatternsDoc
from eroica.engine.facts import Fact, HardwareSignal, HostCpuLoad, JobSlowdown

HW_SIGNALS = (
    "cgroup_throttled_ratio",
    "cpu_util_ratio",
    "runqueue_wait_ratio",
    "io_wait_ratio",
    "involuntary_ctx_switches_per_second",
    "major_faults_per_second",
    "minor_faults_per_second",
    "swap_used_bytes",
    "cgroup_memory_usage_ratio",
    "cgroup_memory_limit_hits_per_second",
    "disk_write_bytes_per_second",
    "disk_read_bytes_per_second",
    "process_cpu_cores",
)
#: NVML signals (HardwareSummary.gpu), compared like the others when the ranks have GPUs
GPU_SIGNALS = (
    "gpu_sm_clock_mhz",
    "gpu_throttled_sample_ratio",
    "gpu_power_w",
    "gpu_temp_c",
    "gpu_pcie_gen",
    "gpu_pcie_width",
    "gpu_util_ratio",
    "gpu_nvlink_links_active",
    "gpu_nvlink_errors_per_second",
)
#: discrete hardware states: a rank whose link runs below its peers' is stated even when it is not late
#: (a degraded link slows every rank of a collective alike, so no rank stands out in busy time)
STATE_SIGNALS = ("gpu_nvlink_links_active", "gpu_pcie_width", "gpu_pcie_gen")
LARGE_GROUP = 64    # from this many members, leave-one-out statistics equal the whole group's

def signal_value(doc: PatternsDoc, sig: str, keep: np.ndarray | None = None) -> float | None:
    """A whole-window signal; over the kept steps only (time-weighted) when a spike step was left
    out and the document has the signal per step."""
    if sig in GPU_SIGNALS:
        return doc.hardware.gpu.get(sig)
    steps = doc.hardware.per_step.get(sig)
    dur = doc.step_times.during_seconds
    if keep is not None and not keep.all() and steps is not None and len(steps) == len(keep) == len(dur):
        pairs = [(v, d) for v, d, k in zip(steps, dur, keep) if k and v is not None]
        w = sum(d for _, d in pairs)
        if pairs and w > 0:
            return sum(v * d for v, d in pairs) / w
    return getattr(doc.hardware, sig)


def hw_signals(docs: dict[int, PatternsDoc], rank: int, ranks: list[int],
               keep: np.ndarray | None = None, signals: tuple[str, ...] = (*HW_SIGNALS, *GPU_SIGNALS)) -> list[Fact]:
    out: list[Fact] = []
    for sig in signals:
        v = signal_value(docs[rank], sig, keep)
        peers = [signal_value(docs[p], sig, keep) for p in ranks if p != rank]
        peers = [p for p in peers if p is not None]
        if v is None or not peers:
            continue
        med = float(np.median(peers))
        out.append(
            HardwareSignal(
                rank=rank, signal=sig, value=round(float(v), 4), peer_median=round(med, 4),
                delta=round(float(v) - med, 4), ratio_to_median=round(cap_ratio(float(v), med), 4),
            )
        )
    return out


def cap_ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1000.0 if a > 0 else 1.0
    return float(min(a / b, 1000.0))


def host_cpu_facts(docs: dict[int, PatternsDoc], rank: int, keep: np.ndarray | None = None) -> list[Fact]:
    """The busy cores of `rank`'s host, less what the job's reporting ranks on it use themselves."""
    host = docs[rank].job.hostname
    on_host = [d for d in docs.values() if d.job.hostname == host]
    cores = len(docs[rank].hardware.per_core_util_ratio)
    utils = [u for u in (signal_value(d, "system_cpu_util_ratio", keep) for d in on_host) if u is not None]
    jobs = [signal_value(d, "process_cpu_cores", keep) for d in on_host]
    if not cores or not utils or any(j is None for j in jobs):
        return []
    busy = float(np.median(utils)) * cores
    job = float(sum(jobs))  # type: ignore[arg-type]
    return [HostCpuLoad(rank=rank, host=host, cores_total=cores, busy_cores=round(busy, 4), job_cores=round(job, 4),
                        other_cores=round(max(busy - job, 0.0), 4), busy_ratio=round(busy / cores, 4),
                        ranks_on_host=len(on_host))]


def job_slowdown(docs: dict[int, PatternsDoc], ranks: list[int], rank: int, suspects: set[int],
                 step_seconds: float) -> JobSlowdown | None:
    """The job's step over the window against the detector's baseline, stated on `rank`."""
    base = [b for r in ranks if (b := docs[r].step_times.baseline_median_seconds)]
    if not base or step_seconds <= 0:
        return None
    b = float(np.median(base))
    return JobSlowdown(
        rank=rank, step_seconds=round(step_seconds, 6), baseline_step_seconds=round(b, 6),
        step_ratio_to_baseline=round(step_seconds / b, 4) if b > 0 else 1.0,
        excess_step_ratio=round(max(step_seconds - b, 0.0) / step_seconds, 4), ranks_standing_out=len(suspects))


def low_states(docs: dict[int, PatternsDoc], ranks: list[int]) -> dict[int, list[str]]:
    """Ranks with a GPU link state below their peers' median, and which states."""
    out: dict[int, list[str]] = {}
    for sig in STATE_SIGNALS:
        values = {r: v for r in ranks if (v := signal_value(docs[r], sig)) is not None}
        whole = float(np.median(list(values.values()))) if len(values) >= LARGE_GROUP else None
        for r, v in values.items():
            peers = [x for p, x in values.items() if p != r] if whole is None else None
            med = whole if whole is not None else (float(np.median(peers)) if peers else None)
            if med is not None and v < med:
                out.setdefault(r, []).append(sig)
    return out


CPU_WAIT_OUTLIER_DELTA = 0.15   # a rank waiting for a CPU this much more of the window than its peers


def cpu_wait_rank(docs: dict[int, PatternsDoc], ranks: list[int], keep: np.ndarray) -> int | None:
    """The rank that waits for a CPU most, when it stands out from the others' median."""
    known = {r: v for r in ranks if (v := signal_value(docs[r], "runqueue_wait_ratio", keep)) is not None}
    if len(known) < 3:
        return None
    r = max(known, key=lambda k: known[k])
    delta = known[r] - float(np.median([v for k, v in known.items() if k != r]))
    return r if delta >= CPU_WAIT_OUTLIER_DELTA else None


def outlier_facts(docs: dict[int, PatternsDoc], ranks: list[int], keep: np.ndarray, suspects: set[int],
                  step_seconds: float) -> list[Fact]:
    """Ranks that matter though none needs to be late: a co-located process can slow every rank of a
    host alike while one of them waits for a CPU far more than the others; a degraded GPU link slows
    every rank of a collective alike. Each such rank gets the job's slowdown (to weigh it by) and,
    unless it is a suspect with all its signals already, the signals that single it out."""
    waiting = cpu_wait_rank(docs, ranks, keep)
    low = low_states(docs, ranks)
    out: list[Fact] = []
    for r in sorted(set(low) | ({waiting} if waiting is not None else set())):
        job = job_slowdown(docs, ranks, r, suspects, step_seconds)
        if job is None:
            continue
        out.append(job)
        if r in suspects:
            continue
        if r == waiting:
            out += hw_signals(docs, r, ranks, keep) + host_cpu_facts(docs, r, keep)
        else:
            out += hw_signals(docs, r, ranks, signals=(*low[r], "gpu_nvlink_errors_per_second"))
    return out
