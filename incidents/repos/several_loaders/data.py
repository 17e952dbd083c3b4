"""Three loaders: training, evaluation (deliberately single-process) and a calibration pass."""
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,)))


def loaders(rank: int, world: int, batch: int = 32):
    train_set, eval_set = dataset(512), dataset(128)
    train = DataLoader(train_set, batch_size=batch,
                       sampler=DistributedSampler(train_set, num_replicas=world, rank=rank),
                       num_workers=1)  # raised from 0 after the last incident
    evaluation = DataLoader(eval_set, batch_size=batch,
                            num_workers=0)  # deterministic eval: keep it in-process
    calibration = DataLoader(eval_set, batch_size=8)
    return train, evaluation, calibration
