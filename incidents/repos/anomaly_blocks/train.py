import torch
from torch.utils.data import DataLoader, TensorDataset

from step import train_step


def loader(batch: int = 32) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(128, 4), torch.randn(128, 1)),
                      batch_size=batch,  # per rank
                      pin_memory=False)


def main(epochs: int = 2) -> torch.nn.Module:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        for batch in loader():
            train_step(model, batch, opt)
    return model
