"""A plain PyTorch DDP training script with no eroica in it: what a user runs today.

    eroica run --out runs/ddp -- torchrun --standalone --nproc-per-node 4 examples/train_ddp.py

`--fault dataloader_stall --fault-rank 1` makes rank 1's input pipeline wait on "storage" from
`--fault-step` on (the e2e tests' real fault); `--fault workload_imbalance` gives that rank a batch
`--imbalance-factor` times larger instead (more device work per step). `--grad-accum N`,
`--optimizers 2` and `--amp` are the loop shapes the attach must count as one step per iteration.
`--device cuda` trains on the rank's GPU (gloo still carries the gradients: two ranks may share one
GPU), as bench/gpu_session.sh does on a machine with a GPU.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--fault", default="none", choices=("none", "dataloader_stall", "workload_imbalance"))
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=0.12)
    p.add_argument("--imbalance-factor", type=int, default=4)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--width", type=int, default=256, help="features of each hidden layer")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--optimizers", type=int, default=1, choices=(1, 2), help="2: body and head step separately")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast with a GradScaler")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    state = {"step": 0}
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)

    def faulty() -> bool:
        return args.fault != "none" and rank == args.fault_rank and state["step"] >= args.fault_step

    class Synthetic(Dataset):
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int):
            return torch.randn(args.width), int(i % 10)

    def collate(items):
        if faulty() and args.fault == "dataloader_stall":
            time.sleep(args.stall_seconds)              # the input pipeline waits on storage
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    loader = DataLoader(Synthetic(), batch_size=args.batch, collate_fn=collate)
    body = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(args.width, args.width), nn.ReLU())])
    model = DDP(nn.Sequential(body, nn.Linear(args.width, 10)).to(device))
    params = list(model.parameters())
    opts = ([torch.optim.SGD(params, lr=0.01)] if args.optimizers == 1 else
            [torch.optim.SGD(params[:-2], lr=0.01), torch.optim.SGD(params[-2:], lr=0.01)])
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp)
    batches = iter(loader)
    for step in range(args.steps):
        state["step"] = step
        for _ in range(args.grad_accum):
            x, y = next(batches)
            x, y = x.to(device), y.to(device)
            if faulty() and args.fault == "workload_imbalance":    # this rank's shard holds bigger batches
                x, y = x.repeat(args.imbalance_factor, 1), y.repeat(args.imbalance_factor)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = nn.functional.cross_entropy(model(x), y) / args.grad_accum
            scaler.scale(loss).backward()
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
