import torch
from torch.utils.data import DataLoader, TensorDataset


def run(steps: int = 10) -> None:
    torch.autograd.set_detect_anomaly(True)
    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        model(x).sum().backward()
        opt.step()
