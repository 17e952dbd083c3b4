"""`eroica simulate --ranks N --fault F [--seed S] -o RUN_DIR`: a SIMULATOR of one profiling window.

It writes `eroica.patterns/v1` files for N GPU ranks of a DP x TP x PP job (8 GPUs per host,
pipeline stages as process groups) with lognormal noise, and injects one fault on chosen ranks,
including the GPU-only ones no CPU machine can produce for real. The ground truth is written beside
the patterns (`ground_truth.json`). It exercises the engine at fleet scale and the GPU rules; it is
not evidence that the collector sees these faults on real hardware.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eroica.collector.facts import (
    PER_STEP_SIGNALS,
    Category,
    CollectorOverhead,
    ConfigFact,
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

FAULTS = ("none", "dataloader_stall", "workload_imbalance", "gpu_throttled", "pcie_degraded", "nvlink_degraded",
          "gpu_hardware_error", "host_launch_bound")
STEPS = 8
GPUS_PER_HOST = 8
CORES_PER_HOST = 96
WINDOW = "w000-s200"


@dataclass(frozen=True)
class Layout:
    """DP x TP x PP (x EP) as Megatron orders ranks: tensor-parallel fastest, then data-parallel,
    then pipeline stages; expert-parallel groups split the data-parallel ranks."""

    world: int
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def position(self, rank: int) -> tuple[int, int, int, int]:
        """(pp stage, dp index, tp index, ep index) of `rank`."""
        stage, rest = divmod(rank, self.dp * self.tp)
        dp, tp = divmod(rest, self.tp)
        return stage, dp, tp, dp % self.ep

    def groups(self, rank: int) -> list[ProcessGroupInfo]:
        stage, dp, tp, ep = self.position(rank)
        out = []
        if self.tp > 1:
            out.append(ProcessGroupInfo(desc="tp", size=self.tp, index=tp))
        if self.pp > 1:
            out.append(ProcessGroupInfo(desc="pp", size=self.pp, index=stage))
        if self.ep > 1:
            out.append(ProcessGroupInfo(desc="ep", size=self.ep, index=ep))
        return out


def _fn(cat: Category, name: str, per_step: list[float], metric: MetricName | None = None,
        mean: float | None = None, calls: int = 1) -> FunctionPattern:
    tot = sum(per_step)
    n = len(per_step)
    return FunctionPattern(
        category=cat, name=name, occurrences_total=n * calls, total_seconds=round(tot, 6),
        critical_seconds=round(tot, 6), beta_ratio=0.0, mean_seconds=round(tot / (n * calls), 6),
        p50_seconds=round(sorted(per_step)[n // 2] / calls, 6), p90_seconds=round(max(per_step) / calls, 6),
        max_seconds=round(max(per_step) / calls, 6), std_seconds=0.0,
        critical_per_step_seconds=[round(x, 6) for x in per_step], metric=metric if mean is not None else None,
        metric_mean=mean, metric_std=None if mean is None else round(0.02 * mean, 3),
        metric_samples_total=20 if mean is not None else 0)


#: (category, name, seconds per step at stage 0, scales with the stage's layers, calls per step)
DEVICE_WORK = (
    (Category.kernel, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas", 0.018, True, 96),
    (Category.kernel, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_cublas", 0.030, True, 192),
    (Category.kernel, "flash_fwd_kernel", 0.006, True, 24),
    (Category.kernel, "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 0.012, True, 24),
    (Category.kernel, "cuApplyLayerNorm", 0.002, True, 48),
    (Category.kernel, "vectorized_elementwise_kernel", 0.003, True, 300),
    (Category.kernel, "multi_tensor_apply_kernel", 0.004, False, 12),
    (Category.memory, "Memcpy HtoD (Pageable -> Device)", 0.004, False, 2),
    (Category.memory, "Memcpy DtoH (Device -> Pinned)", 0.001, False, 2),
    (Category.memory, "Memset (Device)", 0.0003, False, 8),
    (Category.data, "DataLoader.__next__", 0.002, False, 1),
    (Category.python, "Optimizer.step", 0.001, False, 1),
)
COMPUTE_KERNELS = {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas",
                   "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_cublas",
                   "flash_fwd_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"}
MOE_KERNEL = "fused_moe_kernel"
DP_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


Work = list[tuple[Category, str, list[float], int]]   # (category, name, seconds per step, calls per step)


def _work(rank: int, lay: Layout, fault: str, culprit: bool, rng: random.Random) -> Work:
    """The device and host work of one rank, per step (no communication)."""
    stage, _, _, ep = lay.position(rank)
    out = []
    for cat, name, sec, layered, calls in DEVICE_WORK:
        x = sec * (1.0 + 0.2 * stage if layered else 1.0)
        if culprit and fault == "workload_imbalance" and name in COMPUTE_KERNELS:
            x *= 1.5
        if culprit and fault == "gpu_throttled" and cat == Category.kernel:
            x *= 1.4
        if culprit and fault == "gpu_hardware_error" and cat == Category.kernel:   # memory retries, same clock
            x *= 1.3
        if culprit and fault == "pcie_degraded" and cat == Category.memory:
            x *= 6
        if culprit and fault == "dataloader_stall" and cat == Category.data:
            x = 0.050
        out.append((cat, name, [x * rng.lognormvariate(0, 0.03) for _ in range(STEPS)], calls))
    if culprit and fault == "host_launch_bound":
        # the host issues kernels late: launch calls hold the critical path while the device idles
        out.append((Category.compute, "cudaLaunchKernel", [0.045 * rng.lognormvariate(0, 0.03) for _ in range(STEPS)],
                    700))
    if lay.ep > 1:          # experts of unequal load by design: each expert-parallel index its own work
        x = 0.008 * (1.0 + 0.25 * ep) * (1.4 if culprit and fault == "gpu_throttled" else 1.0)
        out.append((Category.kernel, MOE_KERNEL, [x * rng.lognormvariate(0, 0.03) for _ in range(STEPS)], 24))
    return out


def _comm_base(lay: Layout, fault: str) -> list[tuple[str, float]]:
    """Communication that is not waiting for a late rank: (function, seconds per step)."""
    out = [(DP_ALLREDUCE, 0.030 * (1.6 if fault == "nvlink_degraded" else 1.0))]   # a ring runs at its slowest link
    if lay.tp > 1:
        out.append(("ncclDevKernel_AllReduce_Sum_bf16_RING_LL128", 0.004))
    if lay.pp > 1:
        out.append(("ncclDevKernel_SendRecv", 0.003))
    if lay.ep > 1:
        out.append(("ncclDevKernel_AllToAll_RING", 0.005))
    return out


def rank_doc(rank: int, lay: Layout, fault: str, culprit: bool, slowest: list[float], healthy: float,
             seed: int) -> PatternsDoc:
    """One rank's window. Every rank's step is the slowest rank's busy time plus the collectives' own
    time (synchronous training): the late rank waits least, its peers wait for it. `healthy` is the
    slowest busy time without the fault (the step before the window)."""
    rng = random.Random(seed)
    work = _work(rank, lay, fault, culprit, rng)
    busy = [sum(w[2][s] for w in work) for s in range(STEPS)]
    clock, thr, width, links = 1980.0, 0.0, 16.0, 18.0
    if culprit and fault == "gpu_throttled":
        clock, thr = 1410.0, 0.9
    if culprit and fault == "pcie_degraded":
        width = 8.0
    if culprit and fault == "nvlink_degraded":
        links = 12.0
    # XID 92 (high single-bit ECC error rate) and the corrected errors behind it
    xid, ecc = (1.0, 40.0) if culprit and fault == "gpu_hardware_error" else (0.0, 0.0)
    comm = _comm_base(lay, fault)
    wait = [max(slowest[s] - busy[s], 0.0) for s in range(STEPS)]
    comm_steps = [[c * rng.lognormvariate(0, 0.03) + (wait[s] if j == 0 else 0.0) for s in range(STEPS)]
                  for j, (_, c) in enumerate(comm)]
    steps = [busy[s] + sum(c[s] for c in comm_steps) for s in range(STEPS)]
    funcs = [_fn(cat, name, per, MetricName.gpu_sm_clock_mhz if cat == Category.kernel else None,
                 clock if cat == Category.kernel else None, calls) for cat, name, per, calls in work]
    funcs += [_fn(Category.communication, name, per, MetricName.nic_bytes_per_second, 2.0e10, 4)
              for (name, _), per in zip(comm, comm_steps)]
    base = healthy + sum(c for _, c in _comm_base(lay, "none"))
    host_rng = random.Random(rank // GPUS_PER_HOST)
    per_core = [round(0.3 + 0.2 * host_rng.random(), 3) for _ in range(CORES_PER_HOST)]
    scalars = {"cpu_util_ratio": 0.35, "process_cpu_cores": 1.2, "runqueue_wait_ratio": 0.01,
               "cgroup_throttled_ratio": 0.0, "io_wait_ratio": 0.0, "involuntary_ctx_switches_per_second": 40.0,
               "minor_faults_per_second": 200.0, "major_faults_per_second": 0.0, "swap_used_bytes": 0.0,
               "disk_read_bytes_per_second": 1.0e6, "disk_write_bytes_per_second": 2.0e5,
               "system_cpu_util_ratio": round(sum(per_core) / CORES_PER_HOST, 4)}
    noisy = {k: round(v * rng.lognormvariate(0, 0.05), 4) for k, v in scalars.items()}
    per_step = {k: [round(v * rng.lognormvariate(0, 0.05), 4) for _ in range(STEPS)]
                for k, v in noisy.items() if k in PER_STEP_SIGNALS}
    hw = HardwareSummary(sample_interval_seconds=0.01, samples_total=int(sum(steps) * 100), **noisy,
                         per_core_util_ratio=per_core, rss_bytes=2.4e10,
                         nic_bytes_per_second={f"ib{rank % GPUS_PER_HOST}": round(1.2e10 * rng.lognormvariate(0, .05))},
                         gpu={"gpu_sm_clock_mhz": clock, "gpu_mem_clock_mhz": 2619.0, "gpu_throttled_sample_ratio": thr,
                              "gpu_power_w": 650.0, "gpu_power_limit_w": 700.0, "gpu_temp_c": 62.0,
                              "gpu_pcie_gen": 5.0, "gpu_pcie_width": width, "gpu_pcie_max_gen": 5.0,
                              "gpu_pcie_max_width": 16.0, "gpu_util_ratio": 0.92, "gpu_mem_used_bytes": 1.1e11,
                              "gpu_nvlink_links_active": links,
                              "gpu_nvlink_errors_per_second": 3.0 if links < 18 else 0.0,
                              "gpu_throttle_mask": 0x40 if thr else 0.0, "gpu_xid_events_total": xid,
                              "gpu_xid_last": 92.0 if xid else 0.0, "gpu_ecc_corrected_per_second": ecc,
                              "gpu_ecc_uncorrected_total": 0.0},
                         per_step=per_step)
    return PatternsDoc(
        job=JobInfo(rank=rank, world_size=lay.world, local_rank=rank % GPUS_PER_HOST,
                    hostname=f"node{rank // GPUS_PER_HOST:05d}", pid=1000 + rank, backend="nccl", device="cuda",
                    process_groups=lay.groups(rank)),
        window=WindowInfo(window_id=WINDOW, start_step=200, end_step=200 + STEPS, trigger="detector",
                          triggered_by_rank=0, wall_seconds=round(sum(steps), 6)),
        step_times=StepTimes(before_seconds=[round(base * rng.lognormvariate(0, 0.01), 6) for _ in range(20)],
                             during_seconds=[round(s, 6) for s in steps], baseline_median_seconds=round(base, 6)),
        functions=funcs, hardware=hw,
        config=[ConfigFact(key="torch.version", value="2.13.0"), ConfigFact(key="precision", value="bf16"),
                ConfigFact(key="dataloader.num_workers", value="8"), ConfigFact(key="nccl.algo", value="Ring")],
        overhead=CollectorOverhead(detector_seconds_total=0.01, detector_calls_total=200, sampler_cpu_seconds=0.02,
                                   summarize_seconds=0.05, raw_events_total=5000, raw_events_dropped_total=0))


def simulate(out: Path, ranks: int, fault: str, seed: int = 0, pp: int = 1, packed: bool = False,
             tp: int = 1, ep: int = 1, culprits_total: int = 1) -> dict[str, object]:
    """`packed`: one `host-<name>.jsonl` per host (one document per line) instead of a file per rank;
    `culprits_total`: how many ranks the fault hits (the same fault on each)."""
    lay = Layout(ranks, tp=tp, pp=pp, ep=ep)
    rng = random.Random(seed)
    culprits = [] if fault == "none" else sorted(rng.sample(range(ranks), culprits_total))
    seeds = [seed * 1_000_003 + r for r in range(ranks)]
    # first pass: every rank's busy time per step, for the slowest one that everyone waits for
    slowest = [0.0] * STEPS
    healthy = 0.0
    for r in range(ranks):
        work = _work(r, lay, fault, r in culprits, random.Random(seeds[r]))
        slowest = [max(slowest[s], sum(w[2][s] for w in work)) for s in range(STEPS)]
        if r not in culprits:
            healthy = max(healthy, float(np.median([sum(w[2][s] for w in work) for s in range(STEPS)])))
    wdir = out / WINDOW
    wdir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for r in range(ranks):
        doc = rank_doc(r, lay, fault, r in culprits, slowest, healthy, seeds[r])
        size = len(doc.model_dump_json(by_alias=True))     # as the collector states its own size
        doc = doc.model_copy(update={"overhead": doc.overhead.model_copy(update={"pattern_bytes": size})})
        if packed:
            lines.append(doc.model_dump_json(by_alias=True))
            if (r + 1) % GPUS_PER_HOST == 0 or r == ranks - 1:
                (wdir / f"host-{doc.job.hostname}.jsonl").write_text("\n".join(lines) + "\n")
                lines = []
        else:
            write_doc(out, doc)
    truth = {"simulator": "eroica simulate (not real hardware)", "fault": fault, "ranks": culprits,
             "world_size": ranks, "layout": {"dp": lay.dp, "tp": tp, "pp": pp, "ep": ep}, "seed": seed}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth
