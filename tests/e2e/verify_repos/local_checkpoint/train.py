"""A user's training script, no eroica in it. From --save-from on (after warm-up), every rank writes a
resume checkpoint of its model to its own directory after every step, with torch.save, so that a
preempted job loses at most one step. Each rank's directory (--ckpt-dir/rank<r>) is on its node's local
volume; rank 1's volume turned slow, so its saves hold its step and the other ranks wait for it at the
next all-reduce."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(model: nn.Module, directory: str) -> None:
    """The resume point: the latest weights, overwritten every step."""
    torch.save(model.state_dict(), os.path.join(directory, "latest.pt"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--save-from", type=int, default=30)
    p.add_argument("--ckpt-dir", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    directory = os.path.join(args.ckpt_dir, f"rank{rank}")
    os.makedirs(directory, exist_ok=True)
    model = DDP(nn.Sequential(*[m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.save_from:
            save_checkpoint(model, directory)
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
