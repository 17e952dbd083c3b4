"""A second training job, unlike the demo in shape: the held-out workload of `incidents/heldout/`.

The demo job (`eroica.lab.workload`) is where the rules were written: a DDP MLP that reads its
batches in the training thread and does the same thing every step. This one is a small
transformer language model whose life has phases, as real jobs do:

- token batches come from a `DataLoader` with two worker processes (prefetching);
- the blocks are uneven (each has its own feed-forward width), and `--graded` gives rank r
  `r` extra passes through the last block (work that differs by design in several levels);
- every `--eval-every` steps the step ends with an evaluation pass over a few held-out batches;
- every `--ckpt-every` steps every rank writes its checkpoint shard (O_DIRECT, `--ckpt-mb`);
- every step ends with a metrics report (`report_metrics`).

Faults are injected the same real ways as the demo's (cgroups, blkio, tc, co-located processes,
stalls), from `--fault-step` on the chosen rank(s), with the strength given on the command line:
`eroica record --workload lm` picks culprit, strength and onset at random and writes them down.
Slow storage here is felt only at the periodic checkpoint, and a stalled input pipeline in the
loader's worker processes, where prefetching hides part of it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
import warnings
from collections import deque

from eroica.lab.shard import Shard
from eroica.lab.workload import (
    CheckpointWriter,
    _Node,
    fault_pairs,
    progress,
    release,
    start_fault,
    step_end_faults,
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eroica-workload-lm")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-rank", default="1")
    p.add_argument("--fault-step", type=int, default=40)
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--stall-seconds", type=float, default=0.2, help="dataloader_stall (per batch, in a worker), "
                   "user_code, untracked_work: seconds per step")
    p.add_argument("--imbalance-factor", type=float, default=3.0, help="workload_imbalance: sequence length factor")
    p.add_argument("--graded", action="store_true", help="rank r makes r extra passes through the last block")
    p.add_argument("--gc-objects", type=int, default=60_000)
    p.add_argument("--hogs", type=int, default=3)
    p.add_argument("--config-fault", choices=("workers", "anomaly"), default="workers")
    p.add_argument("--fetch-seconds", type=float, default=0.05, help="latency of every batch (remote storage)")
    p.add_argument("--ckpt-every", type=int, default=15)
    p.add_argument("--ckpt-mb", type=float, default=1.0)
    p.add_argument("--ckpt-dir", default="/var/tmp")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--shard-mb", type=int, default=192)
    p.add_argument("--read-mb", type=int, default=40)
    p.add_argument("--mem-limit-mb", type=int, default=96)
    p.add_argument("--stop-after-windows", type=int, default=1, help="healthy runs; faulty runs: at most this many "
                   "windows, ending with the first that opened at or after --fault-step")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=48)
    args = p.parse_args(argv)
    args.plan = {r: f for f, r in fault_pairs(args.fault, str(args.fault_rank)) if f != "none"}
    return args


def _start_step(window_id: str) -> int:
    """`w001-s57` -> 57."""
    try:
        return int(window_id.rsplit("-s", 1)[1])
    except (IndexError, ValueError):
        return -1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    from eroica.collector import Monitor

    warnings.filterwarnings("ignore", message=".*[Aa]nomaly.*")
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(77)                      # the same initial weights on every rank
    fault = args.plan.get(rank, "none")
    vocab = 512
    stalled = multiprocessing.Value("b", False)   # seen by the loader's worker processes (forked)
    fetch = "framework_config" in args.plan.values() and args.config_fault == "workers"
    seq = args.seq

    class Tokens(Dataset):
        def __init__(self, seq_len: int) -> None:
            self.seq_len = seq_len

        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int):
            g = torch.Generator().manual_seed(i)
            return torch.randint(0, vocab, (self.seq_len + 1,), generator=g)

    def collate(items):
        if fetch:
            time.sleep(args.fetch_seconds)
        if stalled.value:
            time.sleep(args.stall_seconds)       # the worker waits on a stalled storage backend
        if shard is not None:
            shard.read()        # in a worker; once the rank is squeezed, the worker joins its cgroup first
        return torch.stack(items)

    def make_loader(workers: int, seq_len: int) -> DataLoader:
        return DataLoader(Tokens(seq_len), batch_size=args.batch, num_workers=workers, collate_fn=collate,
                          prefetch_factor=2 if workers else None, persistent_workers=bool(workers))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = 96
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, ff, dropout=0.0, batch_first=True)
                                        for ff in (128, 384, 192, 256))   # uneven layers
            self.head = nn.Linear(d, vocab)

        def forward(self, x, extra_passes: int = 0):
            h = self.embed(x)
            for b in self.blocks:
                h = b(h)
            for _ in range(extra_passes):
                h = self.blocks[-1](h)
            return self.head(h)

    memory = "host_memory_pressure" in args.plan.values()
    shard = Shard(args.ckpt_dir, rank, args.shard_mb, args.read_mb << 20) if memory else None
    loader = make_loader(2, seq)
    eval_batches = [torch.randint(0, vocab, (args.batch, seq + 1), generator=torch.Generator().manual_seed(k))
                    for k in range(3)]
    model = DDP(LM())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = Monitor(out_dir=args.out)
    batches = iter(mon.wrap_loader(loader))
    ckpt = CheckpointWriter(args.ckpt_dir, rank, int(args.ckpt_mb * (1 << 20)))
    cache: deque[_Node] = deque(maxlen=10 * args.gc_objects)
    hogs: list[subprocess.Popen[bytes]] = []
    extra = rank if args.graded else 0
    t_last = time.monotonic()

    def active(step: int) -> bool:
        return fault != "none" and step >= args.fault_step and (step - args.fault_step) % args.every == 0

    try:
        for step in range(args.steps):
            if fault != "none" and step == args.fault_step:
                start_fault(fault, rank, step, args, hogs, shard)
                if fault == "dataloader_stall":
                    stalled.value = True
                elif fault == "framework_config" and args.config_fault == "workers":
                    batches = iter(mon.wrap_loader(make_loader(0, seq)))
                elif fault == "workload_imbalance":
                    # this rank's shard holds longer sequences than its peers'
                    batches = iter(mon.wrap_loader(make_loader(2, int(seq * args.imbalance_factor))))
            tokens = next(batches)
            if fault == "gc_pause" and active(step):
                cache.extend(_Node(i) for i in range(args.gc_objects))
            with mon.region("train_step"):
                logits = model(tokens[:, :-1], extra)
                loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if args.eval_every and (step + 1) % args.eval_every == 0:
                with mon.region("evaluate"), torch.no_grad():
                    for b in eval_batches:
                        model.module(b[:, :-1], extra)
            if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                with mon.region("checkpoint"):
                    ckpt.write()
            step_end_faults(mon, "report_metrics", fault if active(step) else "none", args.stall_seconds)
            mon.step()
            t_last = progress(rank, step, t_last)
            # a faulty run ends with the first window that opened at or after the fault's onset (the
            # windows before it are the job's healthy history); a healthy one after --stop-after-windows
            onset_seen = args.plan and any(_start_step(w) >= args.fault_step for w in mon.windows_completed)
            if onset_seen or mon.windows_closed >= args.stop_after_windows:
                break
    finally:
        release(ckpt, shard, hogs)
    mon.close()
    print(f"[rank {rank}] done", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
