"""Hugging Face `transformers.Trainer` (with `accelerate`, as the Trainer uses it) on a small,
randomly initialized causal LM built from a config: nothing is downloaded. No eroica in it.

    eroica run --out runs/hf -- torchrun --standalone --nproc-per-node 4 examples/train_hf.py

`--fault dataloader_stall --fault-rank 1` makes rank 1's samples slow to read from `--fault-step`
on (a callback tells the dataset the step; the Trainer builds the DataLoader itself).

The script ends with `Trainer.end()` (accelerate's end of training: `destroy_process_group()`, as
torch asks of every job): `train()` leaves the gloo group alive, and a process that exits with it
alive can abort in the interpreter's shutdown ("terminate called without an active exception",
SIGABRT, after training finished: one of the six runs of this job in three CI runs, with eroica
attached, which does no collective at exit; pytorch/pytorch#190489).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    def __init__(self, seq: int, vocab: int, stall: float) -> None:
        self.seq, self.vocab, self.stall, self.step = seq, vocab, stall, 0

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.stall:
            time.sleep(self.stall)                  # per sample: storage is slow on this rank
        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class FaultAt(TrainerCallback):
    def __init__(self, data: Tokens, step: int, stall: float) -> None:
        self.data, self.at, self.stall_seconds = data, step, stall

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step >= self.at:
            self.data.stall = self.stall_seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=130)
    p.add_argument("--fault", default="none", choices=("none", "dataloader_stall"))
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=0.12, help="per batch")
    p.add_argument("--out", default="/tmp/eroica-hf-trainer")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    batch = 8
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=4, n_head=4)
    model = GPT2LMHeadModel(cfg)                     # random weights from the config: no download
    data = Tokens(seq=64, vocab=cfg.vocab_size, stall=0.0)
    callbacks = []
    if args.fault == "dataloader_stall" and rank == args.fault_rank:
        callbacks.append(FaultAt(data, args.fault_step, args.stall_seconds / batch))
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=batch, max_steps=args.steps, learning_rate=1e-4,
        use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no", logging_steps=10_000,
        dataloader_num_workers=0, disable_tqdm=True, seed=rank)
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks)
    trainer.train()
    trainer.end()


if __name__ == "__main__":
    main()
