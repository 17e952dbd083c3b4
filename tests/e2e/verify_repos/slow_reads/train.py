"""A user's training script, no eroica in it: every sample is read from storage one by one in the
training process (num_workers=0). From --slow-from on, rank --slow-rank's mount answers each read in
--read-ms (a degraded volume); the others' in --healthy-read-ms."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Shard(Dataset):
    def __init__(self, rank: int, args: argparse.Namespace) -> None:
        self.rank, self.args = rank, args

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int):
        a = self.args
        slow = self.rank == a.slow_rank and i // a.batch >= a.slow_from
        time.sleep((a.read_ms if slow else a.healthy_read_ms) / 1000)     # the read
        g = torch.Generator().manual_seed(i)
        return torch.randn(a.width, generator=g), i % 10


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-from", type=int, default=30, help="the step from which the rank's reads are slow")
    p.add_argument("--read-ms", type=float, default=3.0)
    p.add_argument("--healthy-read-ms", type=float, default=0.05)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    loader = DataLoader(Shard(rank, args), batch_size=args.batch, num_workers=0)
    model = DDP(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    for step in range(args.steps):
        x, y = next(batches)
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
