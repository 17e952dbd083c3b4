"""The demo training job: one rank of a small DDP model on synthetic data, with an optional real fault.

Run by the launcher as `python -m eroica.cli.workload` once per rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment, as torchrun sets them). The fault is real: the rank
sleeps in its input pipeline, is moved into a CPU-quota cgroup, gets more samples than its peers,
or churns cyclic garbage so that the collector pauses it, starting at `--fault-step`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque

FAULTS = ("none", "dataloader_stall", "cpu_throttled", "workload_imbalance", "gc_pause")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eroica-workload")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=25)
    p.add_argument("--stall-seconds", type=float, default=0.12)
    p.add_argument("--imbalance-factor", type=int, default=6)
    p.add_argument("--stop-after-windows", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=1024)
    return p.parse_args(argv)


class _Node:
    __slots__ = ("me", "payload")

    def __init__(self, payload: int) -> None:
        self.me = self          # a reference cycle: only the cyclic GC can free it
        self.payload = [payload]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    from eroica.collector import Monitor

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    faulty = args.fault != "none" and rank == args.fault_rank
    state = {"step": 0}

    class Synthetic(Dataset):
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
            return torch.randn(256), int(i % 10)

    def collate(items):  # type: ignore[no-untyped-def]
        if faulty and args.fault == "dataloader_stall" and state["step"] >= args.fault_step:
            time.sleep(args.stall_seconds)      # a stalled input pipeline: waiting on storage
        xs = torch.stack([x for x, _ in items])
        ys = torch.tensor([y for _, y in items])
        return xs, ys

    loader = DataLoader(Synthetic(), batch_size=args.batch, num_workers=0, collate_fn=collate)
    h = args.hidden
    model = DDP(nn.Sequential(nn.Linear(256, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(out_dir=args.out)
    loader = mon.wrap_loader(loader)
    cache: deque[_Node] = deque(maxlen=600_000)
    t_last = time.monotonic()
    for step, (x, y) in enumerate(loader):
        state["step"] = step + 1
        if faulty and step == args.fault_step:
            print(f"[rank {rank}] step {step}: injecting {args.fault}", flush=True)
            if args.fault == "cpu_throttled":
                path = os.environ["EROICA_THROTTLE_CGROUP"]
                with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                    fh.write(str(os.getpid()))
        if faulty and step >= args.fault_step:
            if args.fault == "workload_imbalance":
                x = x.repeat(args.imbalance_factor, 1)    # this rank's shard holds more samples
                y = y.repeat(args.imbalance_factor)
            elif args.fault == "gc_pause":
                cache.extend(_Node(i) for i in range(60_000))  # a bounded cache of cyclic objects
        with mon.region("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with mon.region("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()
        mon.step()
        if rank == 0 and (step + 1) % 10 == 0:
            now = time.monotonic()
            print(f"[rank 0] step {step + 1}: {(now - t_last) / 10 * 1000:.0f} ms/step", flush=True)
            t_last = now
        if len(mon.windows_completed) >= args.stop_after_windows or mon.windows_closed >= args.stop_after_windows:
            break
        if step + 1 >= args.steps:
            break
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
