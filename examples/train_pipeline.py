"""Pipeline parallelism with `torch.distributed.pipelining`: 2 stages x 2 data-parallel replicas on 4
ranks (CPU, gloo), a DeviceMesh with dimensions ("dp", "pp"). No eroica in it.

    eroica run --out runs/pp -- torchrun --standalone --nproc-per-node 4 examples/train_pipeline.py

Rank r is replica r // 2, stage r % 2; each stage's gradients are averaged over its replicas. The
two stages do different work by design, so a rank's peers are the other replica of its stage.
`--fault dataloader_stall --fault-rank 1` stalls rank 1's (stage 1's) input pipeline from `--fault-step`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(256, generator=g), int(i % 10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--fault", default="none", choices=("none", "dataloader_stall"))
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--stall-seconds", type=float, default=0.12)
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    rank, stage_idx = dist.get_rank(), mesh.get_local_rank("pp")
    dp_group = mesh.get_group("dp")
    torch.manual_seed(stage_idx)                        # both replicas of a stage start equal
    state = {"step": 0}

    def collate(items):
        if args.fault != "none" and rank == args.fault_rank and state["step"] >= args.fault_step:
            time.sleep(args.stall_seconds)
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    def block() -> list[nn.Module]:
        return [nn.Linear(256, 256), nn.ReLU()]

    layers = [m for _ in range(4) for m in block()]
    module = nn.Sequential(*layers) if stage_idx == 0 else nn.Sequential(*layers, nn.Linear(256, 10))
    stage = PipelineStage(module, stage_idx, 2, torch.device("cpu"), group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(stage, args.microbatches, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    # both stages of a replica read the same samples: stage 0 the inputs, stage 1 the targets
    loader = DataLoader(Synthetic(), batch_size=64, collate_fn=collate,
                        sampler=range(mesh.get_local_rank("dp"), 10**6, 2))
    batches = iter(loader)
    for step in range(args.steps):
        state["step"] = step
        x, y = next(batches)
        if stage_idx == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        for prm in module.parameters():                 # data parallel over the stage's replicas
            if prm.grad is not None:
                dist.all_reduce(prm.grad, group=dp_group)
                prm.grad /= 2
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
