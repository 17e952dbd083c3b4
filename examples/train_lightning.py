"""PyTorch Lightning with the DDP strategy on CPU (gloo). No eroica in it.

    eroica run --out runs/pl -- torchrun --standalone --nproc-per-node 4 examples/train_lightning.py

Under torchrun, Lightning joins the processes torchrun started. `--fault dataloader_stall
--fault-rank 1` makes rank 1's batches slow to collate from `--fault-step` on.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        return torch.randn(256), int(i % 10)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(256, 256), nn.ReLU())], nn.Linear(256, 10))

    def training_step(self, batch, _i):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=130)
    p.add_argument("--fault", default="none", choices=("none", "dataloader_stall"))
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=0.12)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    model = Net()

    def collate(items):
        if args.fault != "none" and rank == args.fault_rank and model.global_step >= args.fault_step:
            time.sleep(args.stall_seconds)
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    loader = DataLoader(Synthetic(), batch_size=64, collate_fn=collate)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), strategy="ddp",
                        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
