"""`eroica simulate --ranks N --fault F [--seed S] -o RUN_DIR`: a SIMULATOR of one profiling window.

It writes `eroica.patterns/v1` files for N GPU ranks of a DP x TP x PP job (8 GPUs per host,
pipeline stages as process groups) with lognormal noise, and injects one fault on chosen ranks,
including the GPU-only ones no CPU machine can produce for real. The ground truth is written beside
the patterns (`ground_truth.json`). It exercises the engine at fleet scale and the GPU rules; it is
not evidence that the collector sees these faults on real hardware.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from eroica.schema.patterns import PATTERNS_SCHEMA, PER_STEP_SIGNALS, Category, MetricName, ProcessGroupInfo

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


def _fns(rows: list[tuple[Category, str, int, MetricName | None, float | None]],
         per_step: np.ndarray) -> list[dict[str, Any]]:
    """Functions' patterns, as the collector writes them (eroica.patterns/v1, FunctionPattern): one
    row of `per_step` (seconds per step) for each (category, name, calls per step, metric, its mean)."""
    n = per_step.shape[1]
    calls = np.array([r[2] for r in rows], dtype=float)
    tot = per_step.sum(axis=1)
    mx = per_step.max(axis=1)
    stats = np.round(np.stack([tot, tot / (n * calls), np.sort(per_step, axis=1)[:, n // 2] / calls, mx / calls]),
                     6).T.tolist()
    steps = np.round(per_step, 6).tolist()
    out = []
    for (cat, name, c, metric, mean), (t, avg, p50, top), st in zip(rows, stats, steps):
        out.append({
            "category": cat.value, "name": name, "occurrences_total": n * c, "total_seconds": t,
            "critical_seconds": t, "beta_ratio": 0.0, "mean_seconds": avg, "p50_seconds": p50, "p90_seconds": top,
            "max_seconds": top, "std_seconds": 0.0, "critical_per_step_seconds": st,
            "metric": metric.value if metric is not None and mean is not None else None, "metric_mean": mean,
            "metric_std": None if mean is None else round(0.02 * mean, 3),
            "metric_samples_total": 20 if mean is not None else 0})
    return out


@functools.lru_cache(maxsize=64)
def _per_core(host: int) -> tuple[list[float], float]:
    """A host's per-core CPU use (its ranks share it) and the mean."""
    host_rng = random.Random(host)
    per_core = [round(0.3 + 0.2 * host_rng.random(), 3) for _ in range(CORES_PER_HOST)]
    return per_core, round(sum(per_core) / CORES_PER_HOST, 4)


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


Work = list[tuple[Category, str, np.ndarray, int]]   # (category, name, seconds per step, calls per step)


def _work(rank: int, lay: Layout, fault: str, culprit: bool, rng: np.random.Generator) -> Work:
    """The device and host work of one rank, per step (no communication)."""
    stage, _, _, ep = lay.position(rank)
    out = []
    noise = rng.lognormal(0, 0.03, (len(DEVICE_WORK) + 2, STEPS))
    for k, (cat, name, sec, layered, calls) in enumerate(DEVICE_WORK):
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
        out.append((cat, name, x * noise[k], calls))
    if culprit and fault == "host_launch_bound":
        # the host issues kernels late: launch calls hold the critical path while the device idles
        out.append((Category.compute, "cudaLaunchKernel", 0.045 * noise[-2], 700))
    if lay.ep > 1:          # experts of unequal load by design: each expert-parallel index its own work
        x = 0.008 * (1.0 + 0.25 * ep) * (1.4 if culprit and fault == "gpu_throttled" else 1.0)
        out.append((Category.kernel, MOE_KERNEL, x * noise[-1], 24))
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


SCALARS = {"cpu_util_ratio": 0.35, "process_cpu_cores": 1.2, "runqueue_wait_ratio": 0.01,
           "cgroup_throttled_ratio": 0.0, "io_wait_ratio": 0.0, "involuntary_ctx_switches_per_second": 40.0,
           "minor_faults_per_second": 200.0, "major_faults_per_second": 0.0, "swap_used_bytes": 0.0,
           "disk_read_bytes_per_second": 1.0e6, "disk_write_bytes_per_second": 2.0e5}
CONFIG = [{"key": "torch.version", "value": "2.13.0", "since_step": 0},
          {"key": "precision", "value": "bf16", "since_step": 0},
          {"key": "dataloader.num_workers", "value": "8", "since_step": 0},
          {"key": "nccl.algo", "value": "Ring", "since_step": 0}]


def rank_doc(rank: int, lay: Layout, fault: str, culprit: bool, slowest: np.ndarray, healthy: float,
             seed: int) -> dict[str, Any]:
    """One rank's window, as the collector writes it (a dict of eroica.patterns/v1: the writer
    encodes it, tests/lab/test_simulate.py checks it is exactly a valid PatternsDoc's JSON). Every rank's
    step is the slowest rank's busy time plus the collectives' own time (synchronous training): the
    late rank waits least, its peers wait for it. `healthy` is the slowest busy time without the
    fault (the step before the window)."""
    rng = np.random.default_rng(seed)
    work = _work(rank, lay, fault, culprit, rng)
    busy = np.sum([w[2] for w in work], axis=0)
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
    wait = np.maximum(slowest - busy, 0.0)
    comm_steps = np.array([c for _, c in comm])[:, None] * rng.lognormal(0, 0.03, (len(comm), STEPS))
    comm_steps[0] += wait
    steps = busy + comm_steps.sum(axis=0)
    rows: list[tuple[Category, str, int, MetricName | None, float | None]] = [
        (cat, name, calls, MetricName.gpu_sm_clock_mhz, clock) if cat == Category.kernel else (cat, name, calls, None,
                                                                                               None)
        for cat, name, _, calls in work]
    rows += [(Category.communication, name, 4, MetricName.nic_bytes_per_second, 2.0e10) for name, _ in comm]
    funcs = _fns(rows, np.vstack([np.array([w[2] for w in work]), comm_steps]))
    base = healthy + sum(c for _, c in _comm_base(lay, "none"))
    per_core, system_cpu = _per_core(rank // GPUS_PER_HOST)
    names = [*SCALARS, "system_cpu_util_ratio"]
    values = np.array([*SCALARS.values(), system_cpu])
    noisy = np.round(values * rng.lognormal(0, 0.05, len(values)), 4)
    per_step_names = [k for k in names if k in PER_STEP_SIGNALS]
    idx = [names.index(k) for k in per_step_names]
    per_step = np.round(noisy[idx][:, None] * rng.lognormal(0, 0.05, (len(idx), STEPS)), 4).tolist()
    before = np.round(base * rng.lognormal(0, 0.01, 20), 6).tolist()
    nic = round(float(1.2e10 * rng.lognormal(0, .05)))
    hw: dict[str, Any] = {
        "sample_interval_seconds": 0.01, "samples_total": int(float(steps.sum()) * 100),
        **{k: None for k in ("cgroup_nr_throttled_total", "cgroup_cpu_quota_cores", "cgroup_others_cpu_cores",
                             "cgroup_memory_usage_ratio", "cgroup_memory_limit_hits_per_second")},
        **dict(zip(names, noisy.tolist())), "per_core_util_ratio": per_core, "rss_bytes": 2.4e10,
        "nic_bytes_per_second": {f"ib{rank % GPUS_PER_HOST}": float(nic)},
        "gpu": {"gpu_sm_clock_mhz": clock, "gpu_mem_clock_mhz": 2619.0, "gpu_throttled_sample_ratio": thr,
                "gpu_power_w": 650.0, "gpu_power_limit_w": 700.0, "gpu_temp_c": 62.0, "gpu_pcie_gen": 5.0,
                "gpu_pcie_width": width, "gpu_pcie_max_gen": 5.0, "gpu_pcie_max_width": 16.0,
                "gpu_util_ratio": 0.92, "gpu_mem_used_bytes": 1.1e11, "gpu_nvlink_links_active": links,
                "gpu_nvlink_errors_per_second": 3.0 if links < 18 else 0.0,
                "gpu_throttle_mask": 0x40 if thr else 0.0, "gpu_xid_events_total": xid,
                "gpu_xid_last": 92.0 if xid else 0.0, "gpu_ecc_corrected_per_second": ecc,
                "gpu_ecc_uncorrected_total": 0.0},
        # the simulated jobs' loaders run in the training process: no worker processes
        **{k: None for k in ("loader_workers_total", "loader_worker_busy_ratio", "loader_worker_cpu_ratio",
                             "loader_worker_io_wait_ratio", "loader_worker_runqueue_wait_ratio",
                             "loader_worker_major_faults_per_second", "loader_worker_disk_read_bytes_per_second")},
        "loader_worker_blocked_in": {},
        "per_step": dict(zip(per_step_names, per_step))}
    groups = [g.model_dump(mode="json") for g in lay.groups(rank)]
    return {
        "schema": PATTERNS_SCHEMA,
        "job": {"rank": rank, "world_size": lay.world, "local_rank": rank % GPUS_PER_HOST,
                "hostname": f"node{rank // GPUS_PER_HOST:05d}", "pid": 1000 + rank, "role": "worker",
                "backend": "nccl", "device": f"cuda:{rank % GPUS_PER_HOST}", "process_groups": groups},
        "window": {"window_id": WINDOW, "start_step": 200, "end_step": 200 + STEPS, "trigger": "detector",
                   "triggered_by_rank": 0, "wall_seconds": round(float(steps.sum()), 6),
                   "opened_unix_seconds": None, "closed_unix_seconds": None},
        "step_times": {"before_seconds": before, "during_seconds": np.round(steps, 6).tolist(),
                       "baseline_median_seconds": round(base, 6)},
        "functions": funcs, "hardware": hw, "config": CONFIG, "gaps": [],
        "overhead": {"detector_seconds_total": 0.01, "detector_calls_total": 200, "sampler_cpu_seconds": 0.02,
                     "summarize_seconds": 0.05, "raw_events_total": 5000, "raw_events_dropped_total": 0,
                     "raw_trace_bytes": 0, "pattern_bytes": 0},
        "autograd_nodes_total": {}, "autograd_nodes_steps": None, "privacy": "keep"}


def _encode(doc: dict[str, Any]) -> bytes:
    """The document's JSON, with its own size in it (as the collector states it)."""
    size = len(_ENCODER.encode(doc))
    doc["overhead"]["pattern_bytes"] = size + len(str(size)) - 1
    return _ENCODER.encode(doc)


_ENCODER = msgspec.json.Encoder()


def _busy(args: tuple[Layout, str, list[int], list[int], list[int]]) -> tuple[np.ndarray, float]:
    """The slowest busy time per step over these ranks, and the slowest healthy median."""
    lay, fault, ranks, seeds, culprits = args
    slowest, healthy = np.zeros(STEPS), 0.0
    for r, sd in zip(ranks, seeds):
        busy = np.sum([w[2] for w in _work(r, lay, fault, r in culprits, np.random.default_rng(sd))], axis=0)
        slowest = np.maximum(slowest, busy)
        if r not in culprits:
            healthy = max(healthy, float(np.median(busy)))
    return slowest, healthy


def _write_hosts(args: tuple[Path, Layout, str, list[int], list[int], list[int], np.ndarray, float, bool]) -> int:
    """Write these ranks' documents (whole hosts): packed one file per host, or a file per rank."""
    wdir, lay, fault, ranks, seeds, culprits, slowest, healthy, packed = args
    lines: list[bytes] = []
    for r, sd in zip(ranks, seeds):
        data = _encode(rank_doc(r, lay, fault, r in culprits, slowest, healthy, sd))
        if packed:
            lines.append(data)
            if (r + 1) % GPUS_PER_HOST == 0 or r == lay.world - 1:
                (wdir / f"host-node{r // GPUS_PER_HOST:05d}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
                lines = []
        else:
            (wdir / f"rank-{r}.json").write_bytes(data)
    return len(ranks)


def simulate(out: Path, ranks: int, fault: str, seed: int = 0, pp: int = 1, packed: bool = False,
             tp: int = 1, ep: int = 1, culprits_total: int = 1, workers: int | None = None,
             culprits: list[int] | None = None) -> dict[str, object]:
    """`packed`: one `host-<name>.jsonl` per host (one document per line) instead of a file per rank;
    `culprits_total`: how many ranks the fault hits (the same fault on each); `workers`: processes
    (default: every core for a large fleet). Each rank's noise comes from its own seed, so the files
    do not depend on how the ranks are shared among workers."""
    import os

    lay = Layout(ranks, tp=tp, pp=pp, ep=ep)
    rng = random.Random(seed)
    if culprits is None:       # `culprits`: the ranks the fault hits, chosen (e.g. every rank of one host)
        culprits = [] if fault == "none" else sorted(rng.sample(range(ranks), culprits_total))
    else:
        culprits = sorted(set(culprits))
    seeds = [seed * 1_000_003 + r for r in range(ranks)]
    n = workers or (os.cpu_count() or 1 if ranks >= PARALLEL_MIN_RANKS else 1)
    # shares of whole hosts (a packed file is one host's ranks)
    hosts = (ranks + GPUS_PER_HOST - 1) // GPUS_PER_HOST
    cuts = [min(ranks, GPUS_PER_HOST * (hosts * k // n)) for k in range(n + 1)]
    shares = [list(range(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]
    wdir = out / WINDOW
    wdir.mkdir(parents=True, exist_ok=True)
    with _pool(len(shares)) as pool:
        # first pass: every rank's busy time per step, for the slowest one that everyone waits for
        firsts = list(pool.map(_busy, [(lay, fault, sh, [seeds[r] for r in sh], culprits) for sh in shares]))
        slowest = np.max([f[0] for f in firsts], axis=0)
        healthy = max(f[1] for f in firsts)
        list(pool.map(_write_hosts, [(wdir, lay, fault, sh, [seeds[r] for r in sh], culprits, slowest, healthy,
                                      packed) for sh in shares]))
    truth = {"simulator": "eroica simulate (not real hardware)", "fault": fault, "ranks": culprits,
             "world_size": ranks, "layout": {"dp": lay.dp, "tp": tp, "pp": pp, "ep": ep}, "seed": seed}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


PARALLEL_MIN_RANKS = 4096


class _Serial:
    def map(self, fn: Any, items: list[Any]) -> Any:
        return map(fn, items)

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _pool(n: int) -> Any:
    if n <= 1:
        return _Serial()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"))
