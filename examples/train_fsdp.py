"""FSDP2 (`torch.distributed.fsdp.fully_shard`) on CPU with gloo: every block and the root sharded
over the ranks. No eroica in it.

    eroica run --out runs/fsdp -- torchrun --standalone --nproc-per-node 4 examples/train_fsdp.py

`--fault dataloader_stall --fault-rank 1` stalls rank 1's input pipeline from `--fault-step` on.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        return torch.randn(256), int(i % 10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=130)
    p.add_argument("--fault", default="none", choices=("none", "dataloader_stall"))
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=0.12)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)                         # the same initial weights everywhere before sharding
    state = {"step": 0}

    def collate(items):
        if args.fault != "none" and rank == args.fault_rank and state["step"] >= args.fault_step:
            time.sleep(args.stall_seconds)
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    blocks = [nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)]
    model = nn.Sequential(*blocks, nn.Linear(256, 10))
    for b in blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Synthetic(), batch_size=64, collate_fn=collate))
    for step in range(args.steps):
        state["step"] = step
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
