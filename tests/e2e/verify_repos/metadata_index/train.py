"""A user's training script, no eroica in it. Before training, rank --index-rank builds the data set's
metadata index in memory: --index-records records, each pointing back at its parent (a tree, so
reference cycles). After --warmup-steps, a rank whose memory is more than --headroom-mb above what it
held once its model was built trims it after each step with gc.collect() (a guard carried over from a
job that leaked). Only the rank with the index is over, and a full collection walks every object the
process holds (the index, torch's own): that rank pays for it at every step, and the others wait."""

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Record:
    """One sample's metadata: where it lives and the shard entry it belongs to."""

    def __init__(self, parent: "Record | None", key: int) -> None:
        self.parent = parent
        self.children: list[Record] = []
        self.meta = {"key": key, "offset": key * 4096}
        if parent is not None:
            parent.children.append(self)


def build_index(records: int, fanout: int = 64) -> list[Record]:
    roots = [Record(None, r) for r in range(max(records // fanout, 1))]
    return roots + [Record(roots[i % len(roots)], i) for i in range(records - len(roots))]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--index-rank", type=int, default=1)
    p.add_argument("--index-records", type=int, default=120_000)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--headroom-mb", type=float, default=64.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(args.width, args.width), nn.ReLU())],
                              nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    budget_mb = rss_mb() + args.headroom_mb
    index = build_index(args.index_records) if rank == args.index_rank else []
    for step in range(args.steps):
        x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup_steps and rss_mb() > budget_mb:
            gc.collect()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f} index {len(index)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
