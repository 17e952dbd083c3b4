"""Variable-length samples, sharded by rank; metrics pushed from the loop."""
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Sentences(Dataset):
    def __init__(self, n: int = 300) -> None:
        self.lengths = [8 + (i * 37) % 120 for i in range(n)]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(self.lengths[i])


def push_metrics(step: int, value: float) -> None:
    time.sleep(0.005)  # a synchronous call to the metrics gateway


def make_loader(rank: int, world: int) -> DataLoader:
    data = Sentences()
    return DataLoader(
        data,
        batch_size=1,
        sampler=DistributedSampler(data, num_replicas=world, rank=rank),  # by count, not by length
    )


def train(rank: int = 0, world: int = 1, max_steps: int = 20) -> int:
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    step = 0
    it = iter(make_loader(rank, world))
    while step < max_steps:
        x = next(it)
        (x.sum() * w).backward()
        opt.step()
        push_metrics(step, float(w))
        step += 1
    return step
