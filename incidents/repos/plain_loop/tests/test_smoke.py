import torch
from torch.utils.data import DataLoader, TensorDataset

import train


def test_the_loader_yields_full_batches():
    batches = list(train.build_loader(64))
    assert len(batches) == 4 and batches[0][0].shape == (16, 32)


def test_a_loader_in_a_test_is_never_a_target():
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    assert len(list(loader)) == 2
