"""Records of four sources written round-robin (record i from source i % 4; source 1 is long
documents), sharded by rank without shuffling, so that a run can be replayed sample for sample."""
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SOURCES = 4


class RoundRobin(Dataset):
    def __init__(self, n: int = 400) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(64 if i % SOURCES == 1 else 4)


def make_loader(rank: int, world: int) -> DataLoader:
    data = RoundRobin()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank,
                                 shuffle=False)  # replayable
    return DataLoader(data, batch_size=1, sampler=sampler)


def train(rank: int = 0, world: int = 1, max_steps: int = 20) -> int:
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    step = 0
    it = iter(make_loader(rank, world))
    while step < max_steps:
        x = next(it)
        (x.sum() * w).backward()
        opt.step()
        opt.zero_grad()
        step += 1
    return step
