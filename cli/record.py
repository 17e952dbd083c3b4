"""`eroica record`: run the demo job with a real fault and keep its window as an incident.

An incident is `incidents/<ID>/`: the per-rank pattern files of one window (`patterns/`), a
`context.yaml` (job, world size, what was injected and how) and an `expected.yaml` (root cause,
ranks, function hint, minimum confidence, what must not be reported). Anyone can rerun it.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from eroica.cli.launch import launch
from eroica.cli.workload import FAULTS, fault_pairs

HOW = {
    "none": "no fault; one window forced (--force-step)",
    "cpu_contention": "the rank starts --hogs busy processes that share its CPU cgroup (a co-located host service)",
    "user_code": "the rank sleeps --stall-seconds inside the user region log_metrics (a synchronous call)",
    "framework_config": "every batch is fetched with 60 ms latency, hidden by 2 data-loader workers; the rank "
                        "restarts its input pipeline with num_workers=0 (--config-fault anomaly: it turns on "
                        "torch.autograd.set_detect_anomaly instead)",
    "slow_storage": "every rank writes a 128 KiB checkpoint shard per step with O_DIRECT; the rank joins a blkio "
                    "cgroup throttling writes to that device to 1 MiB/s",
    "host_memory_pressure": "every rank reads 40 MiB per step of its 192 MiB data shard through mmap; the rank "
                            "drops its shard from the page cache and joins a 96 MiB memory cgroup",
    "nic_degraded": "each rank in its own network namespace on a bridge; the rank's veth capped with tc tbf "
                    "(300 Mbit/s both ways) at the fault step",
    "dataloader_stall": "the rank's collate_fn sleeps --stall-seconds per batch (a stalled input pipeline)",
    "cpu_throttled": "the rank moves itself into a cgroup v1 child with cpu.cfs_quota_us = 12% of a core",
    "workload_imbalance": "the rank's batch is repeated --imbalance-factor times (more samples than its peers)",
    "gc_pause": "the rank fills a bounded deque with 60k cyclic objects per step (full GC collections)",
    "untracked_work": "the rank spins the CPU --stall-seconds per step between its regions, in code no region "
                      "or op names (no rule knows it)",
}
#: faults no rule names by design: the expected finding is the fallback, reported below 0.5
FALLBACK_EXPECTED = {"untracked_work": {"root_cause": "unknown", "min_confidence": 0.3, "max_confidence": 0.5}}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("record", help="run a real faulty job and keep its window as an incident")
    p.add_argument("--fault", required=True, help=f"one of {', '.join(FAULTS)}, or several separated by commas")
    p.add_argument("--rank", default="1", help="rank, or one rank per fault separated by commas")
    p.add_argument("--force-step", type=int, default=24, help="healthy runs: the step of the forced window")
    p.add_argument("--id", required=True, help="incident id, e.g. INC-0001")
    p.add_argument("--dir", type=Path, default=Path("incidents"))
    p.add_argument("--fault-step", type=int, default=25)
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="extra workload arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    env = {"EROICA_FORCE_WINDOW_AT_STEP": str(args.force_step)} if faults == ["none"] else {}
    with tempfile.TemporaryDirectory(prefix="eroica-record-") as tmp:
        run_dir = Path(tmp)
        t0 = time.time()
        res = launch(run_dir, fault=args.fault, fault_rank=args.rank, fault_step=args.fault_step,
                     env=env, extra_args=args.extra)
        if not res.ok:
            print(f"eroica record: the job failed: {res.returncodes}")
            return 1
        windows = sorted(d for d in run_dir.iterdir() if d.is_dir() and d.name.startswith("w"))
        if not windows:
            print("eroica record: no window opened; nothing to record")
            return 1
        dest.mkdir(parents=True)
        shutil.copytree(windows[0], dest / "patterns" / windows[0].name)
    context = {
        "id": args.id,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "job": {"kind": "eroica demo workload (DDP MLP, gloo, CPU)", "world_size": 4, "host": platform.node()},
        "injected": {"fault": args.fault, "rank": args.rank, "from_step": args.fault_step,
                     "how": "; ".join(HOW[f] for f in faults), "extra_args": args.extra},
        "window": windows[0].name,
        "rerun": f"eroica record --fault {args.fault} --rank {args.rank} --id <NEW-ID>"
                 + (f" --extra {' '.join(args.extra)}" if args.extra else ""),
    }
    if faults == ["none"]:
        expected: dict[str, object] = {"expect": [], "min_confidence": 0.5}
    else:
        expected = {"expect": [{**FALLBACK_EXPECTED.get(f, {"root_cause": f}), "ranks": [r]}
                               for f, r in zip(faults, ranks)],
                    "min_confidence": 0.5, "top": len(faults) == 1,
                    "must_not": [{"ranks_other_than": sorted(set(ranks))}]}
    (dest / "context.yaml").write_text(yaml.safe_dump(context, sort_keys=False))
    (dest / "expected.yaml").write_text(yaml.safe_dump(expected, sort_keys=False))
    print(f"recorded {dest}")
    return 0
