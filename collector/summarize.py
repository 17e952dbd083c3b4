"""Local summary: one window's raw executions and samples -> an `eroica.patterns/v1` document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from eroica.collector.critical import Execution, attribute, metric_by_key, per_step_critical
from eroica.collector.nvml import throttled
from eroica.collector.sampler import SampleSeries
from eroica.schema.patterns import (
    PER_STEP_SIGNALS,
    Category,
    CollectorGap,
    CollectorOverhead,
    ConfigFact,
    FunctionPattern,
    HardwareSummary,
    JobInfo,
    MetricName,
    PatternsDoc,
    StepTimes,
    WindowInfo,
)

MIN_BETA = 0.005            # functions below 0.5% of the critical path are dropped ...
ALWAYS_KEEP = {Category.data, Category.gc, Category.communication, Category.region}  # ... except these
MAX_FUNCTIONS = 40


def percentiles(values: np.ndarray, *qs: float) -> tuple[float, ...]:
    """np.percentile(values, q) for each q (its default linear method, to the bit: tested), sorted
    once, without numpy's percentile machinery, whose first call imports numpy.ma (in every ingestion
    worker and in `eroica diagnose`; measured by bench/traces.py)."""
    s = np.sort(values)
    n = len(s)
    out = []
    for q in qs:
        virtual = (n - 1) * (q / 100)                  # numpy's virtual index for the linear method
        lo = int(virtual)
        hi = min(lo + 1, n - 1)
        a, b, t = float(s[lo]), float(s[hi]), virtual - lo
        diff = b - a
        out.append(float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t))
    return tuple(out)


@dataclass
class WindowRecord:
    """Everything one rank captured in one window, before summarizing."""

    job: JobInfo
    window_id: str
    start_step: int
    trigger: str
    triggered_by_rank: int | None
    step_bounds_ns: list[int]                 # monotonic; len = steps + 1
    before_seconds: list[float]
    baseline_median_seconds: float | None
    executions: list[Execution]
    samples: SampleSeries | None
    gaps: list[CollectorGap] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)
    config_since: dict[str, int] = field(default_factory=dict)    # the step each setting took its value
    events_dropped: int = 0
    detector_seconds_total: float = 0.0
    detector_calls_total: int = 0
    raw_trace_bytes: int = 0
    autograd_nodes: list[tuple[int, dict[str, int]]] = field(default_factory=list)   # light windows
    autograd_nodes_until_ns: int = 0        # nodes were counted until here (0: on every step)


def _rate(series: SampleSeries, col: str) -> np.ndarray | None:
    v = series.columns.get(col)
    if v is None or len(v) < 2 or not np.isfinite(v).any():
        return None
    dt = np.diff(series.t_ns).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dt > 0, np.diff(v) / dt, np.nan)


def _delta(series: SampleSeries, col: str) -> float | None:
    v = series.columns.get(col)
    if v is None:
        return None
    ok = v[np.isfinite(v)]
    return float(ok[-1] - ok[0]) if len(ok) >= 2 else None


def _mean(series: SampleSeries, col: str) -> float | None:
    v = series.columns.get(col)
    if v is None:
        return None
    ok = v[np.isfinite(v)]
    return float(ok.mean()) if len(ok) else None


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def hardware_summary(series: SampleSeries | None, wall_s: float) -> HardwareSummary:
    if series is None or len(series.t_ns) < 2:
        return HardwareSummary(sample_interval_seconds=0.0, samples_total=0 if series is None else len(series.t_ns))
    span = (series.t_ns[-1] - series.t_ns[0]) / 1e9 or wall_s or 1.0

    def per_s(col: str) -> float | None:
        d = _delta(series, col)
        return None if d is None else d / span

    cpu = _delta(series, "main_cpu_ns")
    wait = _delta(series, "main_wait_ns")
    thr = _delta(series, "cg_throttled_ns")
    nr = _delta(series, "cg_nr_throttled")
    busy, total = _delta(series, "sys_busy"), _delta(series, "sys_total")
    nics = {c.split(":", 1)[1]: round(per_s(c) or 0.0, 1) for c in series.columns if c.startswith("nic:")}
    proc_cpu = _delta(series, "proc_cpu_s")
    others = _delta(series, "cg_others_cpu_s")
    gpu: dict[str, float] = {}
    for c, v in series.columns.items():
        ok = v[np.isfinite(v)]
        if not c.startswith("gpu_") or not len(ok):
            continue
        if c == "gpu_nvlink_errors_total":
            gpu["gpu_nvlink_errors_per_second"] = round(float(ok[-1] - ok[0]) / span, 3)
        elif c == "gpu_ecc_corrected_total":         # a counter since the driver loaded: its rate now
            gpu["gpu_ecc_corrected_per_second"] = round(float(ok[-1] - ok[0]) / span, 3)
        elif c == "gpu_ecc_uncorrected_total":
            gpu[c] = float(ok.max())
        elif c == "gpu_xid_events":                  # events since the previous read
            gpu["gpu_xid_events_total"] = float(ok.sum())
        elif c == "gpu_xid_last":
            gpu[c] = float(ok[-1])
        elif c == "gpu_nvlink_links_active":
            gpu[c] = float(ok.min())     # the fewest links up at any sample
        elif c == "gpu_throttle_mask":
            mask = 0
            for x in ok:
                mask |= int(x)
            gpu[c] = float(mask)
            gpu["gpu_throttled_sample_ratio"] = round(float(np.mean([throttled(int(x)) for x in ok])), 4)
        else:
            gpu[c] = round(float(ok.mean()), 3)
            gpu[c.replace("gpu_", "gpu_std_", 1)] = round(float(ok.std()), 3)
    return HardwareSummary(
        sample_interval_seconds=series.interval_seconds,
        samples_total=len(series.t_ns),
        cpu_util_ratio=_r(None if cpu is None else cpu / 1e9 / span),
        process_cpu_cores=_r(None if proc_cpu is None else proc_cpu / span),
        runqueue_wait_ratio=_r(None if wait is None else wait / 1e9 / span),
        involuntary_ctx_switches_per_second=_r(per_s("invol_ctx"), 2),
        io_wait_ratio=_r(_mean(series, "main_in_io")),
        cgroup_throttled_ratio=_r(None if thr is None else min(thr / 1e9 / span, 1.0)),
        cgroup_nr_throttled_total=None if nr is None else int(nr),
        cgroup_cpu_quota_cores=_r(_float(series.extras.get("cgroup_cpu_quota_cores"))),
        cgroup_others_cpu_cores=_r(None if others is None else others / span),
        system_cpu_util_ratio=_r(None if not total or busy is None else busy / total),
        per_core_util_ratio=[float(x) for x in cast(list[float], series.extras.get("per_core_util_ratio") or [])],
        rss_bytes=_r(_mean(series, "rss_bytes"), 0),
        swap_used_bytes=_r(_mean(series, "swap_bytes"), 0),
        cgroup_memory_usage_ratio=_r(_mean(series, "cg_mem_usage_ratio")),
        cgroup_memory_limit_hits_per_second=_r(per_s("cg_mem_limit_hits"), 2),
        major_faults_per_second=_r(per_s("majflt"), 2),
        minor_faults_per_second=_r(per_s("minflt"), 1),
        disk_read_bytes_per_second=_r(per_s("io_read_bytes"), 1),
        disk_write_bytes_per_second=_r(per_s("io_write_bytes"), 1),
        nic_bytes_per_second=nics,
        gpu=gpu,
        **_loader_workers(series, span),
    )


def _loader_workers(series: SampleSeries, span: float) -> dict[str, object]:
    """The loader workers' fields of the summary (none when the rank had no worker at any read)."""
    n = series.columns.get("lw_workers")
    if n is None:
        return {}
    read = np.isfinite(n)
    worker_reads = float(n[read].sum())
    if worker_reads <= 0:
        return {}
    workers = float(n[read].mean())          # workers alive on average (a loader may restart them)

    def share(col: str) -> float | None:
        return _r(float(np.nansum(series.columns[col][read])) / worker_reads)

    def per_worker_time(col: str, scale: float) -> float | None:
        d = _delta(series, col)
        return None if d is None else _r(d / scale / span / workers)

    def rate(col: str, nd: int) -> float | None:
        d = _delta(series, col)
        return None if d is None else _r(d / span, nd)

    return dict(
        loader_workers_total=int(round(float(n[read].max()))),
        loader_worker_busy_ratio=share("lw_busy"),
        loader_worker_io_wait_ratio=share("lw_in_io"),
        loader_worker_cpu_ratio=per_worker_time("lw_cpu_s", 1.0),
        loader_worker_runqueue_wait_ratio=per_worker_time("lw_wait_ns", 1e9),
        loader_worker_major_faults_per_second=rate("lw_majflt", 2),
        loader_worker_disk_read_bytes_per_second=rate("lw_read_bytes", 1),
        loader_worker_blocked_in={str(k): float(v) for k, v in
                                  cast(dict[str, float], series.extras.get("loader_worker_blocked_in") or {}).items()},
    )


def _step_slice(series: SampleSeries, a_ns: int, b_ns: int) -> SampleSeries:
    """The samples of one step, with the last sample before it (counters are differenced)."""
    t = series.t_ns
    lo = max(int(np.searchsorted(t, a_ns, side="right")) - 1, 0)
    hi = int(np.searchsorted(t, b_ns, side="left")) + 1
    return SampleSeries(t_ns=t[lo:hi], columns={c: v[lo:hi] for c, v in series.columns.items()
                                                if not c.startswith(("nic:", "gpu_"))},
                        gaps=[], interval_seconds=series.interval_seconds, sampler_cpu_seconds=0.0, dropped_total=0)


def per_step_hardware(series: SampleSeries | None, bounds: list[int]) -> dict[str, list[float | None]]:
    """PER_STEP_SIGNALS for each step of the window (None where the step had under two samples)."""
    if series is None or len(series.t_ns) < 2 or len(bounds) < 2:
        return {}
    steps = [hardware_summary(_step_slice(series, a, b), (b - a) / 1e9) for a, b in zip(bounds[:-1], bounds[1:])]
    out = {sig: [getattr(h, sig) if h.samples_total >= 2 else None for h in steps] for sig in PER_STEP_SIGNALS}
    return {k: v for k, v in out.items() if any(x is not None for x in v)}


def _metric_for(cat: Category) -> MetricName:
    if cat == Category.communication:
        return MetricName.nic_bytes_per_second
    if cat == Category.kernel:
        return MetricName.gpu_sm_clock_mhz
    return MetricName.cpu_util_ratio


def summarize(rec: WindowRecord, summarize_started: float, now: float) -> PatternsDoc:
    bounds = rec.step_bounds_ns
    t0, t1 = bounds[0], bounds[-1]
    wall_s = max((t1 - t0) / 1e9, 1e-9)
    seg = attribute(rec.executions, t0, t1)
    per_step = per_step_critical(seg, bounds)
    crit = per_step.sum(axis=1)
    durations: dict[int, list[float]] = {}
    index = {k: i for i, k in enumerate(seg.names)}
    for e in rec.executions:
        if e.end_ns <= t0 or e.start_ns >= t1:
            continue
        durations.setdefault(index[(e.category, e.name)], []).append((e.end_ns - e.start_ns) / 1e9)
    untracked = (seg.end_ns - seg.start_ns)[seg.key == 0] / 1e9
    durations[0] = list(untracked)

    rates: dict[MetricName, np.ndarray | None] = {}
    series = rec.samples
    if series is not None and len(series.t_ns) >= 2:
        rates[MetricName.cpu_util_ratio] = _rate(series, "main_cpu_ns")
        nic_cols = [c for c in series.columns if c.startswith("nic:")]
        if nic_cols:
            dt = np.diff(series.t_ns).astype(float) / 1e9
            tot = sum(np.diff(series.columns[c]) for c in nic_cols)
            with np.errstate(invalid="ignore", divide="ignore"):
                rates[MetricName.nic_bytes_per_second] = np.where(dt > 0, tot / dt, np.nan)
        sm = series.columns.get("gpu_sm_clock_mhz")
        if sm is not None and len(sm) >= 2:
            rates[MetricName.gpu_sm_clock_mhz] = sm[:-1]     # a level, not a counter
    metric_stats = {}
    for m, r in rates.items():
        if r is not None and series is not None:
            metric_stats[m] = metric_by_key(seg, series.t_ns, r)
    fast_t = series.extras.get("nic_fast_t_ns") if series is not None else None
    fast_b = series.extras.get("nic_fast_bytes") if series is not None else None
    if isinstance(fast_t, np.ndarray) and isinstance(fast_b, np.ndarray) and len(fast_t) >= 3:
        # ~1 kHz link signature: a capped link is steady (low sigma), a waiting one bursty
        dt = np.diff(fast_t).astype(float) / 1e9
        step = _float(series.extras.get("nic_fast_interval_seconds")) if series is not None else None
        # the pause between two bursts is no sample: a rate over it would smooth the signature
        gap = dt > 2.5 * step if step else np.zeros(len(dt), dtype=bool)
        with np.errstate(invalid="ignore", divide="ignore"):
            fr = np.where((dt > 0) & ~gap, np.diff(fast_b) / dt, np.nan)
        metric_stats[MetricName.nic_bytes_per_second] = metric_by_key(seg, fast_t, fr)

    funcs: list[FunctionPattern] = []
    for i, (cat, name) in enumerate(seg.names):
        beta = float(crit[i] / wall_s)
        if (beta < MIN_BETA and cat not in ALWAYS_KEEP) or crit[i] <= 0:
            continue
        d = np.asarray(durations.get(i, []), dtype=float)
        m = _metric_for(cat)
        mean = std = None
        n = 0
        if m in metric_stats:
            mu, sd, cnt = metric_stats[m]
            if cnt[i] > 0 and np.isfinite(mu[i]):
                mean, std, n = round(float(mu[i]), 4), round(float(sd[i]), 4), int(cnt[i])
        p50, p90 = percentiles(d, 50, 90) if len(d) else (0.0, 0.0)
        funcs.append(
            FunctionPattern(
                category=cat,
                name=name,
                occurrences_total=len(d),
                total_seconds=round(float(d.sum()), 6),
                critical_seconds=round(float(crit[i]), 6),
                beta_ratio=round(min(beta, 1.0), 5),
                mean_seconds=round(float(d.mean()), 6) if len(d) else 0.0,
                p50_seconds=round(p50, 6),
                p90_seconds=round(p90, 6),
                max_seconds=round(float(d.max()), 6) if len(d) else 0.0,
                std_seconds=round(float(d.std()), 6) if len(d) else 0.0,
                critical_per_step_seconds=[round(float(x), 6) for x in per_step[i]],
                metric=m if mean is not None else None,
                metric_mean=mean,
                metric_std=std,
                metric_samples_total=n,
            )
        )
    funcs.sort(key=lambda f: -f.critical_seconds)
    funcs = funcs[:MAX_FUNCTIONS]
    nodes: dict[str, int] = {}
    # the steps whose backward calls were all counted: every step, or those before counting stopped
    until = rec.autograd_nodes_until_ns
    node_steps = sum(1 for b in bounds[1:] if b <= until) if until else len(bounds) - 1
    t_nodes = bounds[node_steps]
    for t, counts in rec.autograd_nodes:
        if t0 <= t < t_nodes:
            for k, v in counts.items():
                nodes[k] = nodes.get(k, 0) + v
    during = [round((b - a) / 1e9, 6) for a, b in zip(bounds[:-1], bounds[1:])]
    gaps = list(rec.gaps) + (list(series.gaps) if series is not None else [])
    return PatternsDoc(
        job=rec.job,
        window=WindowInfo(
            window_id=rec.window_id,
            start_step=rec.start_step,
            end_step=rec.start_step + len(during),
            trigger=rec.trigger,
            triggered_by_rank=rec.triggered_by_rank,
            wall_seconds=round(wall_s, 6),
        ),
        step_times=StepTimes(
            before_seconds=[round(x, 6) for x in rec.before_seconds],
            during_seconds=during,
            baseline_median_seconds=_r(rec.baseline_median_seconds, 6),
        ),
        functions=funcs,
        hardware=hardware_summary(series, wall_s).model_copy(
            update={"per_step": per_step_hardware(series, bounds)}),
        config=[ConfigFact(key=k, value=v, since_step=rec.config_since.get(k)) for k, v in sorted(rec.config.items())],
        gaps=gaps,
        overhead=CollectorOverhead(
            detector_seconds_total=round(rec.detector_seconds_total, 6),
            detector_calls_total=rec.detector_calls_total,
            sampler_cpu_seconds=round(series.sampler_cpu_seconds, 6) if series is not None else 0.0,
            summarize_seconds=round(now - summarize_started, 6),
            raw_events_total=len(rec.executions),
            raw_events_dropped_total=rec.events_dropped + (series.dropped_total if series is not None else 0),
            raw_trace_bytes=rec.raw_trace_bytes,
        ),
        autograd_nodes_total=dict(sorted(nodes.items(), key=lambda kv: -kv[1])[:MAX_FUNCTIONS]),
        autograd_nodes_steps=node_steps if nodes and node_steps < len(bounds) - 1 else None,
    )
