"""Detector step-time overhead, as a ratio against a baseline in the same run.

A real 4-rank gloo DDP job (the demo model). Every rank alternates blocks of steps with and
without `mon.step()` (interleaved A/B in the same processes, so machine noise hits both alike).
The policy never opens a window here: this is the always-on cost (detector + store poll).
Also reports the directly timed cost of `mon.step()` per call.

    .venv/bin/python bench/detector_overhead.py [--blocks 12] [--block-steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from eroica.collector import Monitor, TriggerPolicy

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(out_dir=args.out, policy=TriggerPolicy(threshold_min_ratio=1000.0, sustained_min_ratio=1000.0))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def train_step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        train_step()
        mon.step()
    with_m: list[float] = []
    without: list[float] = []
    cpu = 0.0
    calls = 0
    for b in range(args.blocks * 2):
        use = b % 2 == 0
        for _ in range(args.block_steps):
            t = time.perf_counter()
            train_step()
            if use:
                c0 = time.thread_time()
                mon.step()
                cpu += time.thread_time() - c0
                calls += 1
            (with_m if use else without).append(time.perf_counter() - t)
    per_call = mon._det_seconds / max(mon._det_calls, 1)
    cpu_per_call = cpu / max(calls, 1)
    mon.close()
    res = {"rank": rank, "with": median(with_m), "without": median(without), "per_call": per_call,
           "cpu_per_call": cpu_per_call,
           "windows": len(mon.windows_completed)}
    Path(args.out, f"bench-{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--block-steps", type=int, default=15)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    from eroica.cli.launch import free_port

    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = []
        for r in range(4):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="4",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--out", out, "--blocks",
                                           str(args.blocks), "--block-steps", str(args.block_steps)],
                                          env=env, stderr=subprocess.DEVNULL))
        rc = [p.wait(timeout=600) for p in procs]
        if any(rc):
            print(f"bench failed: {rc}")
            return 1
        rows = [json.loads((Path(out) / f"bench-{r}.json").read_text()) for r in range(4)]
    print("rank  step without  step with  A/B ratio  mon.step() wall/call  CPU/call  CPU share of step")
    for r in rows:
        print(f"{r['rank']:>4}  {r['without'] * 1000:10.2f} ms {r['with'] * 1000:8.2f} ms"
              f"  {r['with'] / r['without']:9.4f}  {r['per_call'] * 1e6:17.1f} us"
              f" {r['cpu_per_call'] * 1e6:7.1f} us  {r['cpu_per_call'] / r['without']:.4%}")
    ratio = median(r["with"] / r["without"] for r in rows)
    share = median(r["cpu_per_call"] / r["without"] for r in rows)
    wall = median(r["per_call"] / r["without"] for r in rows)
    print(f"median A/B step-time ratio (with/without Monitor): {ratio:.4f}")
    print(f"detector cost on the training thread: {share:.4%} of a step in CPU, {wall:.4%} in wall time "
          "(wall includes being descheduled during the store round trip on an oversubscribed host)")
    print(f"windows opened during the benchmark: {sum(r['windows'] for r in rows)} (expected 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
