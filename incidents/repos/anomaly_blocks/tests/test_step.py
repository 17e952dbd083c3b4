import torch

from step import train_step


def test_one_step_lowers_nothing_but_runs():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = train_step(model, (torch.randn(8, 4), torch.randn(8, 1)), opt)
    assert loss.ndim == 0
