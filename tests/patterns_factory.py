"""Synthetic pattern documents built through the real models (for engine unit tests)."""

from __future__ import annotations

import json
from pathlib import Path

from eroica.schema.patterns import (
    Category,
    CollectorGap,
    CollectorOverhead,
    FunctionPattern,
    HardwareSummary,
    JobInfo,
    MetricName,
    PatternsDoc,
    StepTimes,
    WindowInfo,
)

STEPS = 6


def fn(cat: Category, name: str, per_step: float, metric: float | None = 0.6, n: int = STEPS) -> FunctionPattern:
    vals = [per_step] * STEPS
    return FunctionPattern(
        category=cat, name=name, occurrences_total=n, total_seconds=per_step * STEPS,
        critical_seconds=per_step * STEPS, beta_ratio=min(per_step / 0.1, 1.0), mean_seconds=per_step,
        p50_seconds=per_step, p90_seconds=per_step, max_seconds=per_step, std_seconds=0.0,
        critical_per_step_seconds=vals,
        metric=None if metric is None else (MetricName.nic_bytes_per_second if cat == Category.communication
                                            else MetricName.cpu_util_ratio),
        metric_mean=metric, metric_std=0.05 if metric is not None else None, metric_samples_total=10,
    )


def make_doc(rank: int, world: int = 4, step: float = 0.1, busy: dict[str, float] | None = None,
             throttled: float = 0.0, role: str = "worker", cpu_metric: float = 0.6,
             window: str = "w000-s30", gaps: list[tuple[str, str]] | None = None) -> PatternsDoc:
    """A rank whose non-communication functions take `busy` seconds per step; the rest of the
    step is communication wait (how victims look)."""
    busy = busy or {"compute:forward": 0.02, "compute:backward": 0.03, "data:DataLoader.__next__": 0.001}
    funcs = []
    total = 0.0
    for key, v in busy.items():
        cat, name = key.split(":", 1)
        funcs.append(fn(Category(cat), name, v, metric=cpu_metric if cat != "data" else 0.5))
        total += v
    comm = max(step - total, 0.0)
    funcs.append(fn(Category.communication, "gloo:all_reduce", comm, metric=3e8))
    return PatternsDoc(
        job=JobInfo(rank=rank, world_size=world, hostname=f"host{rank // 2}", pid=1000 + rank, role=role),
        window=WindowInfo(window_id=window, start_step=30, end_step=30 + STEPS, trigger="detector",
                          triggered_by_rank=0, wall_seconds=step * STEPS),
        step_times=StepTimes(before_seconds=[0.06] * 10, during_seconds=[step] * STEPS, baseline_median_seconds=0.06),
        functions=funcs,
        hardware=HardwareSummary(sample_interval_seconds=0.01, samples_total=60, cpu_util_ratio=cpu_metric,
                                 cgroup_throttled_ratio=throttled, runqueue_wait_ratio=0.1),
        overhead=CollectorOverhead(detector_seconds_total=0.001, detector_calls_total=40, sampler_cpu_seconds=0.01,
                                   summarize_seconds=0.05, raw_events_total=200, raw_events_dropped_total=0,
                                   pattern_bytes=6000),
        gaps=[CollectorGap(source=s, reason=r) for s, r in gaps or []],
    )


def write_run(tmp: Path, docs: list[PatternsDoc]) -> Path:
    for d in docs:
        wdir = tmp / d.window.window_id
        wdir.mkdir(parents=True, exist_ok=True)
        (wdir / f"rank-{d.job.rank}.json").write_text(json.dumps(d.model_dump(mode="json", by_alias=True)))
    return tmp

