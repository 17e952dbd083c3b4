"""`eroica simulate --ranks N --fault F [--seed S] -o RUN_DIR`: a SIMULATOR of one profiling window.

It writes `eroica.patterns/v1` files for N GPU ranks of a DP x TP x PP job (8 GPUs per host,
pipeline stages as process groups) with lognormal noise, and injects one fault on chosen ranks,
including the GPU-only ones no CPU machine can produce for real. The ground truth is written beside
the patterns (`ground_truth.json`). It exercises the engine at fleet scale and the GPU rules; it is
not evidence that the collector sees these faults on real hardware.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from eroica.collector.facts import (
    Category,
    CollectorOverhead,
    FunctionPattern,
    HardwareSummary,
    JobInfo,
    MetricName,
    PatternsDoc,
    ProcessGroupInfo,
    StepTimes,
    WindowInfo,
)
from eroica.collector.kineto import write_doc

FAULTS = ("none", "dataloader_stall", "workload_imbalance", "gpu_throttled", "pcie_degraded", "nvlink_degraded")
STEPS = 8
GPUS_PER_HOST = 8


def _fn(cat: Category, name: str, per_step: list[float], metric: MetricName | None = None,
        mean: float | None = None) -> FunctionPattern:
    tot = sum(per_step)
    n = len(per_step)
    return FunctionPattern(
        category=cat, name=name, occurrences_total=n, total_seconds=round(tot, 6), critical_seconds=round(tot, 6),
        beta_ratio=0.0, mean_seconds=round(tot / n, 6), p50_seconds=round(sorted(per_step)[n // 2], 6),
        p90_seconds=round(max(per_step), 6), max_seconds=round(max(per_step), 6), std_seconds=0.0,
        critical_per_step_seconds=[round(x, 6) for x in per_step], metric=metric if mean is not None else None,
        metric_mean=mean, metric_std=None if mean is None else round(0.02 * mean, 3),
        metric_samples_total=20 if mean is not None else 0)


def rank_doc(rank: int, world: int, pp: int, fault: str, culprit: bool, rng: random.Random) -> PatternsDoc:
    def noisy(x: float) -> list[float]:
        return [x * rng.lognormvariate(0, 0.03) for _ in range(STEPS)]

    stage = rank * pp // world
    gemm = 0.060 * (1.0 + 0.2 * stage)                   # later stages carry the loss: a bit more work
    copy = 0.004
    load = 0.002
    clock, thr, width, links = 1980.0, 0.0, 16.0, 18.0
    if culprit and fault == "dataloader_stall":
        load = 0.050
    if culprit and fault == "workload_imbalance":
        gemm *= 1.5
    if culprit and fault == "gpu_throttled":
        gemm, clock, thr = gemm * 1.4, 1410.0, 0.9
    if culprit and fault == "pcie_degraded":
        copy, width = copy * 6, 8.0
    if fault == "nvlink_degraded" and culprit:
        links = 12.0
    kernels, copies, loads = noisy(gemm), noisy(copy), noisy(load)
    busy = [a + b + c for a, b, c in zip(kernels, copies, loads)]
    slowest = 0.060 * (1.0 + 0.2 * (pp - 1)) * (1.5 if fault in ("workload_imbalance", "gpu_throttled") else 1.0) \
        + (0.050 if fault == "dataloader_stall" else 0.0) + (0.020 if fault == "pcie_degraded" else 0.0)
    comm_base = 0.030 * (1.6 if fault == "nvlink_degraded" else 1.0)   # the ring runs at its slowest link
    comm = [comm_base * rng.lognormvariate(0, 0.03) + max(slowest * 1.02 - b, 0.0) for b in busy]
    steps = [b + c for b, c in zip(busy, comm)]
    funcs = [_fn(Category.kernel, "ampere_bf16_s16816gemm", kernels, MetricName.gpu_sm_clock_mhz, clock),
             _fn(Category.memory, "Memcpy HtoD (Pageable -> Device)", copies),
             _fn(Category.data, "DataLoader.__next__", loads),
             _fn(Category.communication, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", comm,
                 MetricName.nic_bytes_per_second, 2.0e10)]
    base = 0.060 * (1.0 + 0.2 * (pp - 1)) * 1.02 + 0.030 + copy + load
    hw = HardwareSummary(sample_interval_seconds=0.01, samples_total=int(sum(steps) * 100), cpu_util_ratio=0.35,
                         process_cpu_cores=1.2, runqueue_wait_ratio=0.01, cgroup_throttled_ratio=0.0,
                         gpu={"gpu_sm_clock_mhz": clock, "gpu_throttled_sample_ratio": thr, "gpu_power_w": 650.0,
                              "gpu_temp_c": 62.0, "gpu_pcie_gen": 5.0, "gpu_pcie_width": width,
                              "gpu_util_ratio": 0.92, "gpu_nvlink_links_active": links,
                              "gpu_nvlink_errors_per_second": 3.0 if links < 18 else 0.0,
                              "gpu_throttle_mask": 0x40 if thr else 0.0})
    pgs = [ProcessGroupInfo(desc="pp", size=pp, index=stage)] if pp > 1 else []
    return PatternsDoc(
        job=JobInfo(rank=rank, world_size=world, local_rank=rank % GPUS_PER_HOST,
                    hostname=f"node{rank // GPUS_PER_HOST:05d}", pid=1000 + rank, backend="nccl", device="cuda",
                    process_groups=pgs),
        window=WindowInfo(window_id="w000-s200", start_step=200, end_step=200 + STEPS, trigger="detector",
                          triggered_by_rank=0, wall_seconds=round(sum(steps), 6)),
        step_times=StepTimes(before_seconds=[round(base, 6)] * 20, during_seconds=[round(s, 6) for s in steps],
                             baseline_median_seconds=round(base, 6)),
        functions=funcs, hardware=hw,
        overhead=CollectorOverhead(detector_seconds_total=0.01, detector_calls_total=200, sampler_cpu_seconds=0.02,
                                   summarize_seconds=0.05, raw_events_total=5000, raw_events_dropped_total=0))


def simulate(out: Path, ranks: int, fault: str, seed: int = 0, pp: int = 1, packed: bool = False) -> dict[str, object]:
    """`packed`: one `host-<name>.jsonl` per host (one document per line) instead of a file per rank."""
    rng = random.Random(seed)
    culprits = [] if fault == "none" else sorted(rng.sample(range(ranks), 1))
    hosts: dict[str, list[str]] = {}
    for r in range(ranks):
        doc = rank_doc(r, ranks, pp, fault, r in culprits, random.Random(seed * 1_000_003 + r))
        if packed:
            hosts.setdefault(doc.job.hostname, []).append(
                json.dumps(doc.model_dump(mode="json", by_alias=True), separators=(",", ":")))
        else:
            write_doc(out, doc)
    for host, lines in hosts.items():
        wdir = out / "w000-s200"
        wdir.mkdir(parents=True, exist_ok=True)
        (wdir / f"host-{host}.jsonl").write_text("\n".join(lines) + "\n")
    truth = {"simulator": "eroica simulate (not real hardware)", "fault": fault, "ranks": culprits,
             "world_size": ranks, "pipeline_stages": pp, "seed": seed}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("simulate", help="SIMULATE a window of pattern files for N GPU ranks with one fault")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--fault", choices=FAULTS, default="gpu_throttled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (process groups named 'pp')")
    p.add_argument("--packed", action="store_true", help="one host-<name>.jsonl per host instead of a file per rank")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1 or args.pp < 1 or args.ranks % args.pp:
        print("eroica simulate: --ranks must be a positive multiple of --pp")
        return 2
    truth = simulate(args.output, args.ranks, args.fault, args.seed, args.pp, args.packed)
    print(f"simulated {args.ranks} ranks, fault {args.fault} on ranks {truth['ranks']}: {args.output} "
          f"(ground truth in ground_truth.json)")
    return 0
