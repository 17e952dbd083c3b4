"""Healthy pauses of the demo training job (`eroica.lab.workload`): long steps a real job takes on
purpose, which a hang detector must not mistake for a hang. Each is off unless its option is given:

- `--ckpt0-every N`: rank 0 alone saves the model's state_dict (torch.save, region `save_checkpoint`)
  for about `--ckpt0-seconds`, while its peers wait in the barrier that follows;
- `--eval-every N`: every rank runs forward passes without gradients for about `--eval-seconds`
  (region `evaluate`), then all-reduces its evaluation loss;
- `--first-step-seconds S`: the first step spins the CPU in Python (`warm_up`: compilation, caches);
- `--loader-warmup-seconds S`: the first batch each loader process builds is late (opening shards);
- `--recompile-step K`: at step K every rank spins the CPU in Python (`recompile`: a shape change).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any


def spin(seconds: float) -> int:
    """CPU-bound Python for `seconds` of wall-clock time: small arithmetic, no sleep, no torch op."""
    until = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < until:
        for i in range(200):
            acc = (acc + i * i) % 1_000_003
    return acc


def warm_up(seconds: float) -> None:
    """The first step's extra time: compiling the model, filling caches (CPU work in Python)."""
    spin(seconds)


def recompile(seconds: float) -> None:
    """A recompilation after a shape change: CPU-bound Python on every rank, by this name on its stack."""
    spin(seconds)


class Rank0Checkpoint:
    """Rank 0 alone writes the model's state_dict to a file of its own temporary directory; every
    rank then waits in a barrier (its peers wait there while rank 0 saves)."""

    def __init__(self, directory: str, rank: int) -> None:
        self.rank = rank
        self.dir: str | None = None
        if rank == 0:
            base = directory if os.path.isdir(directory) else "/tmp"
            self.dir = tempfile.mkdtemp(prefix="eroica-ckpt0-", dir=base)

    def save_checkpoint(self, mon: Any, model: Any, seconds: float) -> None:
        """Rank 0 saves, and waits out the rest of `seconds` (a slower disk); then every rank's barrier."""
        import torch
        import torch.distributed as dist

        if self.dir is not None:
            with mon.region("save_checkpoint"):
                t0 = time.monotonic()
                torch.save(model.state_dict(), os.path.join(self.dir, "model.pt"))
                time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        dist.barrier()

    def close(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def evaluate(mon: Any, model: Any, x: Any, seconds: float) -> float:
    """Every rank: forward passes without gradients on fresh batches shaped like `x` for about
    `seconds` (at least one), then the all-reduce of the evaluation loss (the job's eval metric)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    total, n = 0.0, 0
    with mon.region("evaluate"):
        model.eval()
        until = time.monotonic() + seconds
        with torch.no_grad():
            while n == 0 or time.monotonic() < until:
                xs, ys = torch.randn_like(x), torch.randint(0, 10, (x.shape[0],))
                total += float(F.cross_entropy(model(xs), ys))
                n += 1
    model.train()
    metric = torch.tensor([total / n])
    dist.all_reduce(metric)
    return float(metric) / dist.get_world_size()
