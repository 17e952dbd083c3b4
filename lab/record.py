"""Recording an incident: run a lab job with a real fault and keep its windows.

An incident is `incidents/<ID>/`: the per-rank pattern files of one window (`patterns/`), a
`context.yaml` (job, world size, what was injected and how) and an `expected.yaml` (root cause,
ranks, function hint, minimum confidence, what must not be reported). Anyone can rerun it.
"""

from __future__ import annotations

import platform
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eroica.lab.launch import launch
from eroica.lab.workload import fault_pairs

HOW = {
    "none": "no fault; one window forced (--force-step)",
    "cpu_contention": "the rank starts --hogs busy processes that share its CPU cgroup (a co-located host service)",
    "user_code": "the rank sleeps --stall-seconds inside the user region log_metrics (a synchronous call)",
    "framework_config": "every batch is fetched with 60 ms latency, hidden by 2 data-loader workers; the rank "
                        "restarts its input pipeline with num_workers=0 (--config-fault anomaly: it turns on "
                        "torch.autograd.set_detect_anomaly instead)",
    "slow_storage": "every rank writes a 128 KiB checkpoint shard per step with O_DIRECT; the rank joins a blkio "
                    "cgroup throttling writes to that device to 1 MiB/s (--storage-fault reads: whoever builds the "
                    "batches, the rank or its --loader-workers, reads --read-kb of its data shard per batch with "
                    "O_DIRECT, and the rank and its workers join a blkio cgroup throttling that device's reads)",
    "host_memory_pressure": "every rank reads 40 MiB per step of its 192 MiB data shard through mmap (in its "
                            "--loader-workers, when it has any); the rank and its workers drop the shard from the "
                            "page cache and join a 96 MiB memory cgroup",
    "nic_degraded": "each rank in its own network namespace on a bridge; the rank's veth capped with tc tbf "
                    "(300 Mbit/s both ways) at the fault step",
    "dataloader_stall": "the rank's collate_fn sleeps --stall-seconds per batch (a stalled input pipeline; in its "
                        "--loader-workers, when it has any)",
    "cpu_throttled": "the rank moves itself into a cgroup v1 child with cpu.cfs_quota_us = 12% of a core",
    "workload_imbalance": "the rank's batch is repeated --imbalance-factor times (more samples than its peers)",
    "gc_pause": "the rank fills a bounded deque with 60k cyclic objects per step (full GC collections)",
    "untracked_work": "the rank spins the CPU --stall-seconds per step between its regions, in code no region "
                      "or op names (the stack sampler names the function)",
}
#: how the held-out job is hurt, where it differs from the demo's
HOW_LM = {
    "none": "no fault; one window forced at a random step",
    "dataloader_stall": "the rank's loader workers sleep --stall-seconds per batch (two workers prefetch: part of it "
                        "is hidden)",
    "slow_storage": "every rank writes a --ckpt-mb checkpoint shard every 15 steps with O_DIRECT; the rank joins a "
                    "blkio cgroup throttling writes to that device (launcher storage_bps)",
    "workload_imbalance": "the rank's loader yields sequences --imbalance-factor times longer than its peers'",
    "framework_config": "every batch is fetched with 50 ms latency, hidden by 2 loader workers; the rank restarts "
                        "its loader with num_workers=0 (--config-fault anomaly: autograd anomaly detection)",
    "nic_degraded": "each rank in its own network namespace; the rank's veth capped with tc tbf at the fault step "
                    "(launcher nic_rate_mbit)",
    "cpu_throttled": "the rank moves itself into a cgroup v1 child with a CFS quota (launcher throttle_cores)",
    "user_code": "the rank sleeps --stall-seconds inside the user region report_metrics",
    "host_memory_pressure": "every rank's loader workers read 40 MiB per step of its 192 MiB data shard through "
                            "mmap; the rank and its workers drop the shard from the page cache and join a 96 MiB "
                            "memory cgroup (a container too small for the data it maps)",
}
#: faults whose expected finding is not named after them: time in code no region or op names is
#: named after its function by the stack sampler, and blocking or spinning there is user code
EXPECTED_AS = {"untracked_work": {"root_cause": "user_code", "function_contains": "step_end_faults"}}


WORKLOADS = {
    "demo": ("eroica.lab.workload", "eroica demo workload (DDP MLP, gloo, CPU)"),
    "lm": ("eroica.lab.workload_lm", "held-out workload (DDP transformer LM with uneven blocks, loader workers, "
                                     "eval every 20 steps, checkpoint every 15 steps; gloo, CPU)"),
}


@dataclass
class RecordSpec:
    """What `eroica record` was asked for (see its --help)."""

    fault: str
    id: str
    rank: str = "1"
    force_step: int = 24
    dir: Path = Path("incidents")
    fault_step: int = 25
    workload: str = "demo"
    random: int | None = None
    heterogeneous: bool = False
    history_window: int | None = None
    window_at: int | None = None
    netns: bool = False
    extra: list[str] = field(default_factory=list)


def randomize(fault: str, seed: int, workload: str) -> tuple[int, int, list[str], dict[str, float]]:
    """(rank, onset step, workload arguments, launcher settings) drawn for one fault."""
    rng = random.Random(f"{seed}:{fault}:{workload}")
    rank = rng.randrange(4)
    onset = rng.randrange(35, 71) if workload == "lm" else rng.randrange(20, 36)
    extra: list[str] = []
    launch_kw: dict[str, float] = {}
    if fault == "dataloader_stall":
        extra = ["--stall-seconds", f"{rng.uniform(0.25, 0.6):.3f}"]
    elif fault in ("user_code", "untracked_work"):
        extra = ["--stall-seconds", f"{rng.uniform(0.08, 0.2):.3f}"]
    elif fault == "cpu_throttled":
        launch_kw["throttle_cores"] = round(rng.uniform(0.08, 0.2), 3)
    elif fault == "cpu_contention":
        extra = ["--hogs", str(rng.randint(2, 4))]
    elif fault == "workload_imbalance":
        extra = ["--imbalance-factor", f"{rng.uniform(2.0, 4.0):.2f}" if workload == "lm" else str(rng.randint(3, 7))]
    elif fault == "gc_pause":
        extra = ["--gc-objects", str(rng.randint(40_000, 100_000))]
    elif fault == "framework_config":
        extra = ["--config-fault", rng.choice(["workers", "anomaly"])]
    elif fault == "nic_degraded":
        launch_kw["nic_rate_mbit"] = round(rng.uniform(40, 150), 1)
    elif fault == "slow_storage":
        launch_kw["storage_bps"] = int(rng.uniform(0.5, 1.5) * (1 << 20))
    elif fault == "host_memory_pressure":
        extra = ["--read-mb", str(rng.randint(30, 50))]
    return rank, onset, extra, launch_kw


def record(args: RecordSpec) -> int:
    """Run the job, keep its windows as `args.dir/args.id`; 0, or 1/2 with the reason printed."""
    dest = args.dir / args.id
    if dest.exists():
        print(f"eroica record: {dest} exists; pick a new id (incident ids are never reused)")
        return 2
    try:
        pairs = fault_pairs(args.fault, str(args.rank))
    except ValueError as exc:
        print(f"eroica record: {exc}")
        return 2
    faults, ranks = [f for f, _ in pairs], [r for _, r in pairs]
    module, kind = WORKLOADS[args.workload]
    extra, launch_kw = list(args.extra), dict[str, Any]()
    healthy = faults == ["none"]
    if args.random is not None and not healthy:
        if len(faults) > 1:
            print("eroica record: --random draws one fault at a time")
            return 2
        ranks[0], args.fault_step, drawn, launch_kw = randomize(faults[0], args.random, args.workload)
        args.rank = str(ranks[0])
        extra = drawn + extra
    elif args.random is not None:
        args.force_step = random.Random(f"{args.random}:none:{args.workload}").randrange(35, 71)
    if args.heterogeneous:
        extra = ["--graded" if args.workload == "lm" else "--graded-by-design", *extra]
    if args.workload == "lm" and not healthy:
        extra += ["--stop-after-windows", "4"]
    env = {"EROICA_FORCE_WINDOW_AT_STEP": str(args.force_step)} if healthy else {}
    if args.window_at is not None and not healthy:
        env["EROICA_FORCE_WINDOW_AT_STEP"] = str(args.window_at)   # as `eroica control --window-now` would
    if args.history_window is not None and not healthy:
        # a window while the job is still healthy, then the fault: the job's own history
        env["EROICA_FORCE_WINDOW_AT_STEP"] = str(args.history_window)
        extra += ["--stop-after-windows", "2"] if args.workload == "demo" else []
    with tempfile.TemporaryDirectory(prefix="eroica-record-") as tmp:
        run_dir = Path(tmp)
        t0 = time.time()
        res = launch(run_dir, fault=args.fault, fault_rank=args.rank, fault_step=args.fault_step, env=env,
                     extra_args=extra, module=module, netns=args.netns,
                     steps=args.fault_step + 100 if not healthy else 200, **launch_kw)
        if not res.ok:
            print(f"eroica record: the job failed: {res.returncodes}")
            return 1
        windows = sorted((d for d in run_dir.iterdir() if d.is_dir() and d.name.startswith("w")),
                         key=lambda d: d.name)
        if not windows and (healthy or args.workload == "demo"):
            print("eroica record: no window opened; nothing to record")
            return 1
        dest.mkdir(parents=True)
        (dest / "patterns").mkdir()
        for w in windows:     # every window the job opened: the ones before the onset are its history
            shutil.copytree(w, dest / "patterns" / w.name)
        if not windows:       # a slowdown the detector missed is a missed diagnosis: kept as such
            print(f"eroica record: no window opened after the fault began; {dest} records the miss")
    context = {
        "id": args.id,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "job": {"kind": kind + ((", graded work by design: rank r makes r extra passes through the last block"
                                 if args.workload == "lm" else ", graded work by design: rank r processes (1 + r/3)x "
                                 "the samples") if args.heterogeneous else ""),
                "world_size": 4, "host": platform.node(), "heterogeneous": bool(args.heterogeneous),
                "own_network_namespaces": bool(args.netns or "nic_degraded" in faults)},
        "injected": {"fault": args.fault, "rank": args.rank, "from_step": None if healthy else args.fault_step,
                     "how": "; ".join((HOW_LM if args.workload == "lm" else {}).get(f, HOW[f]) for f in faults),
                     "extra_args": extra,
                     "launcher": launch_kw, "random_seed": args.random},
        "window": windows[-1].name if windows else None,
        "windows": [w.name for w in windows],
        "rerun": f"eroica record --workload {args.workload} --fault {args.fault} --rank {args.rank} "
                 f"--fault-step {args.fault_step} --id <NEW-ID>"
                 + (f" --random {args.random}" if args.random is not None else "")
                 + (" --heterogeneous" if args.heterogeneous else "") + (" --netns" if args.netns else "")
                 + (f" --history-window {args.history_window}" if args.history_window is not None else "")
                 + (f" --window-at {args.window_at}" if args.window_at is not None else "")
                 + (f" --extra {' '.join(args.extra)}" if args.extra else ""),
    }
    if healthy:
        expected: dict[str, object] = {"expect": [], "min_confidence": 0.5}
    else:
        expected = {"expect": [{**EXPECTED_AS.get(f, {"root_cause": f}), "ranks": [r]}
                               for f, r in zip(faults, ranks)],
                    "min_confidence": 0.5, "top": len(faults) == 1,
                    "must_not": [{"ranks_other_than": sorted(set(ranks))}]}
    (dest / "context.yaml").write_text(yaml.safe_dump(context, sort_keys=False))
    (dest / "expected.yaml").write_text(yaml.safe_dump(expected, sort_keys=False))
    print(f"recorded {dest} ({len(windows)} window(s): {', '.join(w.name for w in windows) or 'none'})")
    return 0
