"""A user's training script, no eroica in it. The corpus is four sources, one of them long documents,
and the script shards it with DistributedSampler(shuffle=False), so that a run can be reproduced sample
for sample. Its first part (--stage-two-from steps' worth) was written with the sources rotated; the
rest by a round-robin writer: record i comes from source i % 4. An unshuffled sampler gives rank r the
records r, r+4, r+8, ...: in the second part rank 1 gets every long document, every step."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SOURCES = 4


class Corpus(Dataset):
    def __init__(self, args: argparse.Namespace, world: int) -> None:
        self.args, self.stage_two = args, args.stage_two_from * args.batch * world

    def __len__(self) -> int:
        return (self.args.steps + 10) * self.args.batch * SOURCES

    def __getitem__(self, i: int):
        a = self.args
        source = i % SOURCES if i >= self.stage_two else (i + i // SOURCES) % SOURCES
        rows = a.long_rows if source == 1 else a.short_rows
        g = torch.Generator().manual_seed(i)
        return torch.randn(rows, a.width, generator=g), torch.randint(0, 10, (rows,), generator=g)


def collate(batch):
    return torch.cat([x for x, _ in batch]), torch.cat([y for _, y in batch])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--short-rows", type=int, default=4)
    p.add_argument("--long-rows", type=int, default=64)
    p.add_argument("--stage-two-from", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    corpus = Corpus(args, world)
    sampler = DistributedSampler(corpus, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(corpus, batch_size=args.batch, sampler=sampler, collate_fn=collate)
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
