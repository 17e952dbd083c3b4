"""What the Monitor reads about its process: its place in the job, and the settings that shape a step."""

from __future__ import annotations

import contextlib
import os
from typing import Any


def dist_info() -> tuple[int, int, str, Any]:
    """rank, world size, backend and the job's store, from torch.distributed when initialised."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from torch.distributed import distributed_c10d as c10d

            store = None
            with contextlib.suppress(Exception):
                store = c10d._get_default_store()
            return dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), store
    except Exception:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), "none", None


def device_of(local_rank: int) -> str:
    """The rank's accelerator as findings name it ("cuda:3"): the current CUDA device once the job
    has touched CUDA, else the one its local rank conventionally takes; "cpu" without CUDA. Never
    raises and never initializes CUDA itself."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
        if torch.cuda.is_initialized():
            return f"cuda:{torch.cuda.current_device()}"
        return f"cuda:{local_rank % max(torch.cuda.device_count(), 1)}"
    except Exception:
        return "cpu"


def framework_config(config: dict[str, str]) -> bool:
    """Fill `config` with the framework and environment settings peers should share (a rank whose
    setting differs is a suspect); False when torch is not importable."""
    ok = True
    try:
        import torch

        config["torch.version"] = torch.__version__
        config["torch.num_threads"] = str(torch.get_num_threads())
        config["torch.num_interop_threads"] = str(torch.get_num_interop_threads())
        config["torch.autograd.detect_anomaly"] = str(torch.is_anomaly_enabled())
        config["torch.grad_enabled"] = str(torch.is_grad_enabled())
    except Exception:
        ok = False
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NCCL_ALGO", "NCCL_PROTO", "CUDA_VISIBLE_DEVICES"):
        if var in os.environ:
            config[f"env.{var}"] = os.environ[var]
    config["cpu.count"] = str(os.cpu_count())
    with contextlib.suppress(Exception):
        config["cpu.affinity_count"] = str(len(os.sched_getaffinity(0)))
    return ok


def date_settings(config: dict[str, str], seen: dict[str, str], since: dict[str, int], step: int) -> None:
    """Date each setting's value in `since`: the step it was first seen with it (`seen`: the values
    last dated), 0 when seen by the end of the job's first step (what the job started with)."""
    at = step if step > 1 else 0
    for key, value in config.items():
        if seen.get(key) != value:
            seen[key] = value
            since[key] = at


JOB_NAME_ENV = ("EROICA_JOB_NAME", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID")


def job_name(given: str | None) -> str:
    """The job's name for the policy's eligible_jobs: the Monitor's argument, else the scheduler's."""
    if given is not None:
        return given
    return next((os.environ[v] for v in JOB_NAME_ENV if os.environ.get(v)), "")
