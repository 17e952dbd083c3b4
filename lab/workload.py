"""The demo training job: one rank of a small DDP model on synthetic data, with optional real faults.

Run by the launcher as `python -m eroica.lab.workload` once per rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment, as torchrun sets them). Faults are real and start at
`--fault-step` on the chosen rank(s); `--every N` makes them intermittent (every N-th step):

- dataloader_stall: the rank's collate function sleeps (an input pipeline waiting on storage);
- cpu_throttled: the rank moves itself into a cgroup with a CFS CPU quota;
- cpu_contention: the rank starts busy "host service" processes that share its CPU cgroup;
- workload_imbalance: the rank's batch holds more samples than its peers';
- gc_pause: the rank fills a bounded cache with cyclic objects, so full GC collections pause it;
- user_code: the rank makes a blocking call inside a user region (`log_metrics`) every step;
- framework_config: every rank fetches each batch with some latency, hidden by two data-loader
  worker processes; the rank restarts its input pipeline with `num_workers=0`, so the fetch lands
  on its critical path (`--config-fault anomaly` instead turns on autograd anomaly detection);
- slow_storage: every rank writes a checkpoint shard each step (O_DIRECT, region `save_checkpoint`);
  the rank moves into a blkio cgroup that throttles writes to that device;
- host_memory_pressure: every rank reads its data shard through the page cache (mmap); the rank
  drops its shard from the cache and joins a memory cgroup too small to hold it, so every read
  faults the pages back in from disk;
- untracked_work: the rank spins the CPU between its regions, in code no region or op names; the
  stack sampler names the function that spends it (`step_end_faults`): user code. Recordings from
  before the sampler (INC-0036) hold only untracked time: there it must say `unknown`;
- nic_degraded: the launcher caps the rank's link (each rank has its own network namespace) with
  a token bucket when the rank announces the fault step.

Several faults at once: `--fault a,b --fault-rank 1,3`.

Healthy pauses (a checkpoint on rank 0, evaluation, a slow first step, a loader's warm-up, a
recompilation), which a hang detector must not take for a hang: `eroica.lab.pauses`.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any

from eroica.lab import pauses
from eroica.lab.errors import WorkloadArgError
from eroica.lab.shard import Shard

FAULTS = ("none", "dataloader_stall", "cpu_throttled", "cpu_contention", "workload_imbalance", "gc_pause",
          "user_code", "framework_config", "nic_degraded", "slow_storage", "host_memory_pressure",
          "untracked_work", "hang_loader", "hang_lock", "hang_desync", "hang_kill", "hang_nic", "hang_shape",
          "hang_gil")
#: the CPUs the job's processes may run on, read before a rank pins itself (`--pin-rank`)
HOST_CPUS = sorted(os.sched_getaffinity(0))
HANGS = FAULTS[-7:]          # one rank stops for good (eroica.collector.hang, tests/e2e/test_hang_e2e.py)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eroica-workload")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--fault", default="none", help="fault name, or several separated by commas")
    p.add_argument("--fault-rank", default="1", help="rank, or one rank per fault separated by commas")
    p.add_argument("--fault-step", type=int, default=25)
    p.add_argument("--every", type=int, default=1, help="apply the fault every N-th step (intermittent)")
    p.add_argument("--fault-until", type=int, default=None,
                   help="lift the fault at this step (the fix, inside the running job); default: never")
    p.add_argument("--on-off", type=int, default=0, metavar="N",
                   help="the fault is on for N steps, then off for N, and so on (intermittent); 0: always on")
    p.add_argument("--rotate-every", type=int, default=0, metavar="N",
                   help="dataloader_stall: the fault moves to the next rank every N steps (something the ranks "
                        "share, not one rank); 0: it stays on its rank")
    p.add_argument("--stall-seconds", type=float, default=0.12)
    p.add_argument("--imbalance-factor", type=int, default=6)
    p.add_argument("--uneven-by-design", type=int, default=1, metavar="FACTOR",
                   help="the upper half of the ranks processes FACTOR times the samples of the lower half, "
                        "by design and from the first step (ranks that do different work: no valid peer group)")
    p.add_argument("--graded-by-design", action="store_true",
                   help="rank r runs its last hidden layer round(layers * r / 3) extra times (depths 1x, 1.33x, 1.67x, "
                        "2x): work that differs by design in several levels, from the first step (no valid peer group)")
    p.add_argument("--ckpt-every", type=int, default=1, help="slow_storage: write the checkpoint shard every N steps")
    p.add_argument("--pin-rank", type=int, default=None,
                   help="this rank runs pinned to one CPU from the start (a different CPU affinity, harmless alone)")
    p.add_argument("--bump-step", type=int, default=None,
                   help="every rank sleeps --bump-seconds per step for 4 steps from this step (a small job-wide bump "
                        "that opens a window before the fault begins)")
    p.add_argument("--bump-seconds", type=float, default=0.03)
    p.add_argument("--pause-step", type=int, default=None, help="every rank pauses once at this step (a checkpoint)")
    p.add_argument("--pause-seconds", type=float, default=2.0)
    p.add_argument("--ckpt0-every", type=int, default=0, metavar="N",
                   help="healthy pause: every N-th step rank 0 alone saves the model's state_dict (torch.save, region "
                        "save_checkpoint, under --ckpt-dir) for about --ckpt0-seconds, then every rank waits in a "
                        "barrier; 0: never")
    p.add_argument("--ckpt0-seconds", type=float, default=2.0, help="the rank 0 checkpoint's length (a floor)")
    p.add_argument("--ckpt0-slow-step", type=int, default=None, metavar="K",
                   help="fault: from step K on the rank 0 checkpoint takes 4x --ckpt0-seconds (its disk became slow)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="healthy pause: every N-th step every rank runs forward passes without gradients for about "
                        "--eval-seconds (region evaluate), then all-reduces the evaluation loss; 0: never")
    p.add_argument("--eval-seconds", type=float, default=1.0)
    p.add_argument("--first-step-seconds", type=float, default=0.0,
                   help="healthy pause: the first step spins the CPU in Python this much longer on every rank "
                        "(warm_up: compiling, filling caches)")
    p.add_argument("--loader-warmup-seconds", type=float, default=0.0,
                   help="healthy pause: the first batch each loader process (the rank, or each worker) builds is "
                        "this much late (opening shards, filling a cache)")
    p.add_argument("--recompile-step", type=int, default=None, metavar="K",
                   help="healthy pause: at step K every rank spins the CPU in Python for --recompile-seconds "
                        "(recompile: a recompilation after a shape change)")
    p.add_argument("--recompile-seconds", type=float, default=3.0)
    p.add_argument("--gc-objects", type=int, default=60_000)
    p.add_argument("--hogs", type=int, default=3)
    p.add_argument("--config-fault", choices=("workers", "anomaly"), default="workers")
    p.add_argument("--fetch-seconds", type=float, default=0.06, help="framework_config: fetch latency per batch")
    p.add_argument("--ckpt-bytes", type=int, default=131072, help="slow_storage: bytes each rank writes per step")
    p.add_argument("--ckpt-dir", default="/var/tmp", help="slow_storage: a disk-backed directory (O_DIRECT)")
    p.add_argument("--shard-mb", type=int, default=192, help="host_memory_pressure: data shard per rank")
    p.add_argument("--read-mb", type=int, default=40, help="host_memory_pressure: shard bytes read per step")
    p.add_argument("--storage-fault", choices=("writes", "reads"), default="writes",
                   help="slow_storage: the checkpoint's writes are throttled, or the reads of the data shard "
                        "(--read-kb per batch with O_DIRECT, by whoever builds the batches)")
    p.add_argument("--read-kb", type=int, default=512, help="slow_storage reads: shard bytes read per batch")
    p.add_argument("--loader-workers", type=int, default=0,
                   help="the loader's worker processes (persistent, prefetching); 0: batches are built in the rank")
    p.add_argument("--decode-ms", type=float, default=0.0,
                   help="CPU time each batch costs whoever builds it (decoding, augmenting): a busy loop, every rank")
    p.add_argument("--mem-limit-mb", type=int, default=96, help="host_memory_pressure: the rank's memory limit")
    p.add_argument("--stop-after-windows", type=int, default=1)
    p.add_argument("--independent", action="store_true",
                   help="each rank trains its own model (no DDP gradient all-reduce): ranks survive a peer's exit")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=10, help="hidden layers (autograd nodes matter for some faults)")
    args = p.parse_args(argv)
    if args.ckpt0_every < 0 or args.eval_every < 0 or args.on_off < 0 or args.rotate_every < 0:
        p.error("--ckpt0-every, --eval-every, --on-off and --rotate-every are 0 (never) or a number of steps")
    if args.rotate_every and args.fault != "dataloader_stall":
        p.error("--rotate-every moves a dataloader_stall (a per-step fault) from rank to rank; "
                f"not {args.fault!r}, whose setup is the rank's own")
    try:
        args.plan = {r: f for f, r in fault_pairs(args.fault, str(args.fault_rank)) if f != "none"}
    except ValueError as exc:
        p.error(str(exc))
    return args


def fault_pairs(fault: str, fault_rank: str) -> list[tuple[str, int]]:
    """`"a,b"` and `"1,3"` (or one rank for all) -> [("a", 1), ("b", 3)]; ValueError when they do not pair."""
    faults = [f.strip() for f in fault.split(",") if f.strip()]
    try:
        ranks = [int(r) for r in fault_rank.split(",") if r.strip()]
    except ValueError as exc:
        raise WorkloadArgError(f"--fault-rank {fault_rank!r}: ranks are integers separated by commas") from exc
    if len(ranks) == 1 and len(faults) > 1:
        ranks = ranks * len(faults)
    if not faults or len(ranks) != len(faults) or any(f not in FAULTS for f in faults):
        raise WorkloadArgError(f"faults must come from {', '.join(FAULTS)}, with one rank per fault")
    return list(zip(faults, ranks))


class _Node:
    __slots__ = ("me", "payload")

    def __init__(self, payload: int) -> None:
        self.me = self          # a reference cycle: only the cyclic GC can free it
        self.payload = [payload]


class CheckpointWriter:
    """Writes one shard per step with O_DIRECT (no page cache: the device's speed is what counts)."""

    def __init__(self, directory: str, rank: int, size: int) -> None:
        import mmap

        self.size = max(4096, size // 4096 * 4096)
        self.buf = mmap.mmap(-1, self.size)          # page-aligned, as O_DIRECT requires
        self.buf.write(b"\x5a" * self.size)
        self.path = os.path.join(directory, f"eroica-ckpt-{os.getpid()}-rank{rank}.bin")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)

    def write(self) -> None:
        os.pwrite(self.fd, self.buf, 0)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


def join_cgroup(env_var: str) -> None:
    """Move this process into the cgroup the launcher made for the fault (its path in `env_var`)."""
    with open(os.path.join(os.environ[env_var], "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))


def start_fault(fault: str, rank: int, step: int, args: argparse.Namespace, hogs: list[subprocess.Popen[bytes]],
                shard: Shard | None) -> None:
    """The one-time part of a fault at its onset (the launcher reads the `injecting` line: it caps a
    link then). Faults that act every step are applied by the workload itself."""
    print(f"[rank {rank}] step {step}: injecting {fault}", flush=True)
    if fault == "cpu_throttled":
        join_cgroup("EROICA_THROTTLE_CGROUP")
    elif fault == "cpu_contention":
        # a host service started by this rank's container: it shares the rank's CPU cgroup, not the
        # training process's CPU affinity (a rank pinned to one CPU does not pin the container's services)
        spin = f"import os; os.sched_setaffinity(0, {HOST_CPUS!r})\nwhile True: pass"
        for _ in range(args.hogs):
            hogs.append(subprocess.Popen([sys.executable, "-c", spin]))
    elif fault == "framework_config" and args.config_fault == "anomaly":
        import torch

        torch.autograd.set_detect_anomaly(True)
    elif fault == "host_memory_pressure":
        assert shard is not None
        shard.squeeze(args.mem_limit_mb)          # its loader workers follow on their next read
    elif fault == "slow_storage" and getattr(args, "storage_fault", "writes") == "reads":
        assert shard is not None
        shard.throttle()                          # its loader workers follow on their next read
    elif fault == "slow_storage":
        join_cgroup("EROICA_BLKIO_CGROUP")
    elif fault == "hang_lock":
        # a background flusher takes the metrics lock and never gives it back (stuck on its own I/O)
        threading.Thread(target=lambda: (METRICS_LOCK.acquire(), threading.Event().wait()), daemon=True).start()
        time.sleep(0.2)
    elif fault == "hang_kill":
        os.kill(os.getpid(), signal.SIGKILL)       # the rank's process dies (an OOM kill, a segfault)


METRICS_LOCK = threading.Lock()


def release(ckpt: CheckpointWriter | None, shard: Shard | None, hogs: list[subprocess.Popen[bytes]]) -> None:
    """What a fault left behind: the checkpoint and shard files, the injected host-service processes."""
    if ckpt is not None:
        ckpt.close()
    if shard is not None:
        shard.close()
    for hog in hogs:
        hog.send_signal(signal.SIGKILL)
        hog.wait()


def step_end_faults(mon, region: str, fault: str, seconds: float) -> None:
    """The end of a step: the user's metrics region (`user_code` blocks in it), then `untracked_work`
    spins the CPU outside every region and op."""
    with mon.region(region):
        if fault == "user_code":
            time.sleep(seconds)                    # a synchronous call to a slow metrics endpoint
        elif fault == "hang_lock":
            with METRICS_LOCK:                     # the flusher holds it forever
                pass
        elif fault == "hang_gil":
            # a C extension stuck while it holds the GIL (ctypes.PyDLL does not release it): no other
            # Python thread of this process runs, the watchdog's included
            ctypes.PyDLL(None).sleep(3600)
    if fault == "untracked_work":
        spin_until = time.perf_counter() + seconds
        while time.perf_counter() < spin_until:
            pass


STEP_LOG_ENV = "EROICA_LAB_STEP_LOG"      # rank 0 appends each step's seconds there (bench/trigger.py)
_step_log: list[Any] = []                  # [file, the last step's end]


def progress(rank: int, step: int, t_last: float) -> float:
    """Rank 0 prints its step time every 10 steps (the launcher echoes it), and logs every step's
    time where STEP_LOG_ENV says; returns the new mark."""
    if rank == 0 and os.environ.get(STEP_LOG_ENV):
        now = time.monotonic()
        if not _step_log:
            _step_log[:] = [open(os.environ[STEP_LOG_ENV], "a", buffering=1), now]
        else:
            _step_log[0].write(f"{now - _step_log[1]:.6f}\n")
            _step_log[1] = now
    if rank != 0 or (step + 1) % 10:
        return t_last
    now = time.monotonic()
    print(f"[rank 0] step {step + 1}: {(now - t_last) / 10 * 1000:.0f} ms/step", flush=True)
    return now


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    from eroica.collector import Monitor

    warnings.filterwarnings("ignore", message=".*[Aa]nomaly.*")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    if args.pin_rank == rank:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    fault = args.plan.get(rank, "none")
    first_rank, world = (min(args.plan) if args.plan else 0), dist.get_world_size()
    if args.rotate_every:                  # every rank carries the fault, active on one rank at a time
        fault = args.plan.get(first_rank, "none")
    step_now = multiprocessing.Value("i", 0, lock=False)   # the rank's step, seen by its loader workers too

    def active(step: int) -> bool:
        since = step - args.fault_step
        if fault == "none" or since < 0 or since % args.every or (args.fault_until is not None
                                                                   and step >= args.fault_until):
            return False
        if args.on_off and (since // args.on_off) % 2:
            return False
        return not args.rotate_every or (first_rank + since // args.rotate_every) % world == rank

    class Synthetic(Dataset):
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int):
            return torch.randn(256), int(i % 10)

    fetch = "framework_config" in args.plan.values() and args.config_fault == "workers"
    loader_warmup = [args.loader_warmup_seconds]    # per process: each worker holds its own copy

    def collate(items):
        if loader_warmup[0]:
            time.sleep(loader_warmup[0])        # the loader's first batch: opening shards, filling a cache
            loader_warmup[0] = 0.0
        if fetch:
            time.sleep(args.fetch_seconds)      # every batch comes from remote storage with latency
        if fault == "dataloader_stall" and active(step_now.value):
            time.sleep(args.stall_seconds)      # a stalled input pipeline: waiting on storage
        if fault == "hang_loader" and active(step_now.value):
            threading.Event().wait()            # a read from storage that never returns
        if shard is not None:
            shard.read()                        # the samples' bytes come from this rank's shard
        if args.decode_ms:                      # decoding and augmenting the samples: CPU work, no sleep
            until = time.thread_time() + args.decode_ms / 1000
            while time.thread_time() < until:
                pass
        xs = torch.stack([x for x, _ in items])
        ys = torch.tensor([y for _, y in items])
        return xs, ys

    def make_loader(workers: int) -> DataLoader:
        return DataLoader(Synthetic(), batch_size=args.batch, num_workers=workers, collate_fn=collate,
                          prefetch_factor=4 if workers else None, persistent_workers=bool(workers))

    plan = set(args.plan.values())
    reads = "slow_storage" in plan and args.storage_fault == "reads"
    ckpt = CheckpointWriter(args.ckpt_dir, rank, args.ckpt_bytes) if "slow_storage" in plan and not reads else None
    # the shard is there before the loader's workers are forked: they read it
    shard = Shard(args.ckpt_dir, rank, args.shard_mb, args.read_kb << 10, direct=True) if reads else \
        Shard(args.ckpt_dir, rank, args.shard_mb, args.read_mb << 20) if "host_memory_pressure" in plan else None
    loader = make_loader(args.loader_workers or (2 if fetch else 0))
    h = args.hidden
    layers: list[nn.Module] = [nn.Linear(256, h), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(h, h), nn.ReLU()]
    class Deeper(nn.Sequential):
        """Its last hidden layer runs `extra` more times (the same weights: DDP sees one model)."""

        def __init__(self, *mods: nn.Module, extra: int) -> None:
            super().__init__(*mods)
            self.extra = extra

        def forward(self, x):
            body = list(self)
            for layer in body[:-1]:
                x = layer(x)
            for _ in range(self.extra):
                x = body[-2](body[-3](x))
            return body[-1](x)

    # depth by design: rank r is round(layers * r / 3) layers deeper (1x, 1.33x, 1.67x, 2x)
    extra = round(args.layers * rank / 3) if args.graded_by_design else 0
    net = Deeper(*layers, nn.Linear(h, 10), extra=extra)
    model = net if args.independent else DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fds_before = len(os.listdir("/proc/self/fd"))
    mon = Monitor(out_dir=args.out)
    batches = iter(mon.wrap_loader(loader))
    cache: deque[_Node] = deque(maxlen=10 * args.gc_objects)
    hogs: list[subprocess.Popen[bytes]] = []
    sync_metric = any(f in HANGS for f in args.plan.values())
    ckpt0 = pauses.Rank0Checkpoint(args.ckpt_dir, rank) if args.ckpt0_every else None
    t_last = time.monotonic()
    done = 0
    try:
        for step in range(args.steps):
            if fault == "framework_config" and fetch and step == args.fault_step:
                # the input pipeline is restarted with another configuration on this rank
                batches = iter(mon.wrap_loader(make_loader(0)))
            x, y = next(batches)
            step_now.value = step + 1
            if fault != "none" and step == args.fault_step:
                start_fault(fault, rank, step, args, hogs, shard)
            if args.uneven_by_design > 1 and rank >= dist.get_world_size() // 2:
                x, y = x.repeat(args.uneven_by_design, 1), y.repeat(args.uneven_by_design)
            if args.bump_step is not None and args.bump_step <= step < args.bump_step + 4:
                time.sleep(args.bump_seconds)
            if active(step):
                if fault == "workload_imbalance":
                    x = x.repeat(args.imbalance_factor, 1)    # this rank's shard holds more samples
                    y = y.repeat(args.imbalance_factor)
                elif fault == "gc_pause":
                    cache.extend(_Node(i) for i in range(args.gc_objects))
            with mon.region("forward"):
                if step == 0 and args.first_step_seconds:
                    pauses.warm_up(args.first_step_seconds)
                if step == args.recompile_step:
                    pauses.recompile(args.recompile_seconds)
                loss = nn.functional.cross_entropy(model(x), y)
            with mon.region("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            if sync_metric and not (fault == "hang_desync" and step == args.fault_step):
                metric = loss.detach().reshape(1)
                if fault == "hang_shape" and step == args.fault_step:
                    metric = metric.repeat(4)            # this rank logs a per-class vector: another shape
                dist.all_reduce(metric)                  # the job's loss for logging: one more collective
            if args.pause_step is not None and step == args.pause_step:
                time.sleep(args.pause_seconds)           # a checkpoint or evaluation pause, within the policy
            if ckpt is not None and (step + 1) % args.ckpt_every == 0:
                with mon.region("save_checkpoint"):
                    ckpt.write()
            if ckpt0 is not None and (step + 1) % args.ckpt0_every == 0:
                slow = args.ckpt0_slow_step is not None and step >= args.ckpt0_slow_step
                ckpt0.save_checkpoint(mon, model, args.ckpt0_seconds * (4 if slow else 1))
            if args.eval_every and (step + 1) % args.eval_every == 0:
                pauses.evaluate(mon, model, x, args.eval_seconds)
            step_end_faults(mon, "log_metrics", fault if active(step) else "none", args.stall_seconds)
            mon.step()
            done = step + 1
            t_last = progress(rank, step, t_last)
            if mon.windows_closed >= args.stop_after_windows or step + 1 >= args.steps:
                break
    finally:
        release(ckpt, shard, hogs)
        if ckpt0 is not None:
            ckpt0.close()
    mon.close()
    left = sorted(t.name for t in threading.enumerate() if t.name.startswith("eroica-"))
    print(f"[rank {rank}] done: {done} steps; eroica threads left: {left}; "
          f"open fds before the Monitor {fds_before}, after close {len(os.listdir('/proc/self/fd'))}", flush=True)
    if not args.independent:
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
