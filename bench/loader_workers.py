"""What sampling a rank's DataLoader workers costs the sampler helper, in one run.

A real DataLoader with persistent workers (0, 2, 4 and 8 of them, each block shuffled per round so
drift hits every count alike) is running in this process, its workers building batches; the
collector's `LoaderWorkers` source reads them as the sampler helper does (`read()`: each worker's
/proc stat, schedstat, io and, when asleep, its wchan). Reported per worker count: the CPU time of
one read (median over rounds), and the share of one core it costs at the helper's rate for slow
sources (every SLOW_EVERY-th sample of `sample_interval_seconds`), i.e. while a window is open.
The baseline is the same read with no workers (only the children scan).

    .venv/bin/python bench/loader_workers.py [--rounds 20] [--reads 50]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from statistics import median

COUNTS = (0, 2, 4, 8)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--reads", type=int, default=50, help="reads per block")
    args = p.parse_args()

    import torch
    from torch.utils.data import DataLoader, Dataset

    from eroica.collector.loader_workers import LoaderWorkers
    from eroica.collector.policy import TriggerPolicy
    from eroica.collector.sampler import SLOW_EVERY

    class Slow(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.002)                 # a read: the workers sleep and run in turn
            return torch.randn(64)

    loaders = {n: DataLoader(Slow(), batch_size=8, num_workers=n, persistent_workers=bool(n),
                             prefetch_factor=2 if n else None) for n in COUNTS}
    iters = {n: iter(dl) for n, dl in loaders.items() if n}
    for it in iters.values():
        next(it)                              # the workers are up
    per_read: dict[int, list[float]] = {n: [] for n in COUNTS}
    seen: dict[int, int] = {}
    rng = random.Random(0)
    order = list(COUNTS)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for n in order:
            # only this loader's workers are children of interest: the others are filtered by pid
            src = LoaderWorkers(os.getpid())
            src.read()
            if n == 0:
                src.workers = []
            else:
                mine = {w.pid for w in loaders[n]._iterator._workers}
                src.workers = [w for w in src.workers if w in mine]
            seen[n] = len(src.workers)
            it = iters.get(n)
            t0 = time.thread_time()
            for _ in range(args.reads):
                if it is not None:
                    next(it)                  # the workers keep working while they are read
                src.reads = 1                 # no rescan inside the block: the per-read cost
                src.read()
            per_read[n].append((time.thread_time() - t0) / args.reads)
            if it is not None:                # the batches' own cost, apart from the reads
                t1 = time.thread_time()
                for _ in range(args.reads):
                    next(it)
                per_read[n][-1] -= (time.thread_time() - t1) / args.reads
    rate = 1.0 / (TriggerPolicy().sample_interval_seconds * SLOW_EVERY)
    base = median(per_read[0])
    print(f"loader-worker sampling, {args.rounds} rounds x {args.reads} reads, at {rate:.0f} reads/s while a "
          f"window is open (every {SLOW_EVERY}th sample)")
    print(f"{'workers':>8} {'found':>6} {'us/read':>9} {'us/worker':>10} {'core share':>11}")
    for n in COUNTS:
        m = median(per_read[n])
        per_worker = (m - base) / n * 1e6 if n else 0.0
        print(f"{n:>8} {seen[n]:>6} {m * 1e6:>9.0f} {per_worker:>10.0f} {m * rate:>10.3%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
