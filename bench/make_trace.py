"""A big multi-rank PyTorch profiler trace for the trace benchmark (bench/traces.py): a real 4-rank
gloo DDP job on CPU, a small transformer, every operator recorded with its input shapes, one
Chrome-trace JSON per rank (with distributedInfo), about 30 MB each.

    python bench/make_trace.py OUT_DIR [--ranks 4] [--active 16]

Nothing is synthesized: the events are the profiler's own."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path


def _rank(rank: int, world: int, port: int, out: str, active: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = DDP(nn.TransformerEncoder(layer, num_layers=4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=active, repeat=1)) as prof:
        for _ in range(active + 2):
            loss = model(x).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(Path(out) / f"job_rank{rank}.pt.trace.json"))   # never a pattern file's name
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--active", type=int, default=16, help="profiled steps per rank (16: about 30 MB per rank)")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    args.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args.ranks, port, str(args.out), args.active), nprocs=args.ranks)
    total = sum(f.stat().st_size for f in args.out.glob("job_rank*.pt.trace.json"))
    print(f"{args.ranks} rank traces, {total / 1e6:.0f} MB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
