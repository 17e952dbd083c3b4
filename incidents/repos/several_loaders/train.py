import gc

import torch

from data import loaders


def run(rank: int = 0, world: int = 1, epochs: int = 1) -> float:
    train, evaluation, _ = loaders(rank, world)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.AdamW(model.parameters())
    gc.disable()  # collected by hand between epochs
    for _ in range(epochs):
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        gc.collect()
    with torch.no_grad():
        return sum(float((model(x).argmax(1) == y).float().mean()) for x, y in evaluation)
