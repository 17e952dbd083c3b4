"""A user's training script, no eroica in it. Every rank writes a resume checkpoint of its model to its
own directory after every step, with torch.save, so that a preempted job loses at most one step. Each
rank's directory is on its node's local volume (--ckpt-dir/rank<r>). From --slow-from on, rank
--slow-rank's volume is a degraded one (--slow-dir: the test mounts a volume whose writes are capped
there), so its saves hold its step and the other ranks wait for it at the next all-reduce; before,
every rank checkpoints to a healthy volume, as the job always did."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(model: nn.Module, directory: str) -> None:
    """The resume point: the latest weights, overwritten every step."""
    torch.save(model.state_dict(), os.path.join(directory, "latest.pt"))


def volume(args: argparse.Namespace, rank: int, step: int) -> str:
    """The rank's node-local checkpoint directory; the fault: rank --slow-rank's turns slow at --slow-from."""
    if rank == args.slow_rank and step >= args.slow_from:
        return args.slow_dir
    return os.path.join(args.ckpt_dir, f"rank{rank}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--slow-from", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--slow-dir", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    os.makedirs(volume(args, rank, 0), exist_ok=True)
    model = DDP(nn.Sequential(*[m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        save_checkpoint(model, volume(args, rank, step))
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
