"""Everything comes from configs/train.yaml; the code only reads it."""
from pathlib import Path

import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

CONFIG = Path(__file__).parent / "configs" / "train.yaml"


def load_config(path: Path = CONFIG) -> dict:
    return yaml.safe_load(path.read_text())


def build(cfg: dict):
    torch.autograd.set_detect_anomaly(cfg["debug"]["detect_anomaly"])
    data = TensorDataset(torch.randn(256, cfg["model"]["width"]))
    loader = DataLoader(data, batch_size=cfg["data"]["batch_size"], num_workers=cfg["data"]["num_workers"])
    model = torch.nn.Linear(cfg["model"]["width"], 1)
    return loader, model


def main(max_steps: int | None = None) -> int:
    loader, model = build(load_config())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while True:
        for (x,) in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if max_steps is not None and step >= max_steps:
                return step
