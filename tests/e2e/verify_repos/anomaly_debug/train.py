"""A user's training script, no eroica in it. A NaN was once seen on one rank, so the script can trace
autograd anomalies on a chosen rank from a chosen step (--debug-rank, --debug-from): set once while
debugging and never taken out. Anomaly detection records a stack for every forward op and checks every
backward result, so that rank's steps grow and the others wait for it."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=160)
    p.add_argument("--debug-rank", type=int, default=1)
    p.add_argument("--debug-from", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(*[m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == args.debug_rank and step == args.debug_from:
            print(f"rank {rank}: tracing autograd anomalies from step {step}", flush=True)
            torch.autograd.set_detect_anomaly(True)
        x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
