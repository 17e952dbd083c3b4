"""A user's training script, no eroica in it: after every step, each rank reports its loss to a metrics
endpoint and waits for the answer. From --slow-from on, rank --slow-rank's endpoint answers in
--report-ms (an overloaded collector on its host); the others' in --healthy-report-ms."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def report_metrics(args: argparse.Namespace, rank: int, step: int, loss: float) -> None:
    """Send the step's metrics and wait for the endpoint to acknowledge them (a blocking HTTP call)."""
    slow = rank == args.slow_rank and step >= args.slow_from
    time.sleep((args.report_ms if slow else args.healthy_report_ms) / 1000)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=30, help="the step from which the rank's endpoint is slow")
    p.add_argument("--report-ms", type=float, default=60.0)
    p.add_argument("--healthy-report-ms", type=float, default=0.2)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        report_metrics(args, rank, step, loss.item())
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
