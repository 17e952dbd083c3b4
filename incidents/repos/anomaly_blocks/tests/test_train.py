import torch

import train


def test_the_loader_gives_per_rank_batches():
    x, y = next(iter(train.loader(batch=16)))
    assert x.shape == (16, 4) and y.shape == (16, 1)


def test_an_epoch_runs_the_loop_and_moves_the_weights():
    torch.manual_seed(0)
    before = torch.nn.Linear(4, 1).weight.detach().clone()
    torch.manual_seed(0)
    model = train.main(epochs=1)
    assert not torch.equal(model.weight.detach(), before)
