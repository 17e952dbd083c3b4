"""Launch the demo job: N local ranks (like torchrun), its own CPU cgroup, and real fault plumbing.

cgroup v1 is used when writable (`/sys/fs/cgroup/cpu`): the job gets a cgroup with high
`cpu.shares` (less noise from other load), and `cpu_throttled` gets a child cgroup with a CFS
quota that the faulty rank moves itself into at the fault step. Everything created is removed
in `finally`, even when the job fails or times out.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from eroica.collector.hang_probe import FR_DEFAULT, FR_ENV
from eroica.lab.errors import FaultSetupError
from eroica.lab.netns import RankNetworks
from eroica.lab.netns import available as netns_available
from eroica.lab.workload import fault_pairs

CPU_ROOT = Path("/sys/fs/cgroup/cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KilledCgroup:
    """A cgroup we made: on cleanup, what is left inside is killed and the group removed."""

    path: Path

    def cleanup(self) -> list[str]:
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            for _ in range(50):
                if not (self.path / "cgroup.procs").read_text().split():
                    break
                time.sleep(0.05)
            self.path.rmdir()
        except OSError as exc:
            return [f"could not remove {self.path}: {exc}"]
        return []


@dataclass
class CpuCgroups:
    """A job cgroup (high shares) and an optional throttled child; removed on cleanup()."""

    job: Path | None = None
    throttled: Path | None = None
    ranks: dict[int, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, throttle_cores: float | None, world_size: int = 0, required_by: str | None = None) -> CpuCgroups:
        """A job cgroup with one child per rank (equal shares, like one container per rank)."""
        cg = cls()
        if not (CPU_ROOT / "cgroup.procs").exists() or not os.access(CPU_ROOT, os.W_OK):
            cg.notes.append("cgroup v1 cpu controller not writable: job runs without its own cgroup")
            if required_by is not None:
                raise FaultSetupError(
                    f"{required_by} needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu "
                    "(run as root on a host with cgroup v1)"
                )
            return cg
        try:
            cg.job = CPU_ROOT / f"eroica-job-{uuid.uuid4().hex[:8]}"
            cg.job.mkdir()
            (cg.job / "cpu.shares").write_text("8192")
            for r in range(world_size):
                cg.ranks[r] = cg.job / f"rank-{r}"
                cg.ranks[r].mkdir()
            if throttle_cores is not None:
                cg.throttled = cg.job / "throttled"
                cg.throttled.mkdir()
                period = 100_000
                (cg.throttled / "cpu.cfs_period_us").write_text(str(period))
                (cg.throttled / "cpu.cfs_quota_us").write_text(str(int(period * throttle_cores)))
        except Exception:
            cg.cleanup()
            raise
        return cg

    def add(self, pid: int, rank: int) -> None:
        target = self.ranks.get(rank, self.job)
        if target is not None:
            try:
                (target / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                self.notes.append(f"could not move pid {pid} into {target}: {exc}")

    def cleanup(self) -> None:
        """Kill what the job left in its cgroups (e.g. injected host services), then remove them."""
        for path in [self.throttled, *self.ranks.values(), self.job]:
            if path is not None and path.exists():
                self.notes.extend(KilledCgroup(path).cleanup())
        self.job = self.throttled = None
        self.ranks = {}


@dataclass
class MemoryCgroup(KilledCgroup):
    """A cgroup v1 memory group under ours (the faulty rank sets its limit when it joins)."""

    @classmethod
    def create(cls) -> MemoryCgroup:
        try:
            own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if line.split(":", 2)[1] == "memory")
            path = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / f"eroica-mem-{uuid.uuid4().hex[:8]}"
            path.mkdir()
        except (StopIteration, OSError) as exc:
            raise FaultSetupError(f"host_memory_pressure needs a writable cgroup v1 memory controller: {exc}") from exc
        return cls(path)


@dataclass
class BlkioCgroup(KilledCgroup):
    """A cgroup v1 blkio group that throttles writes (or reads) to the device holding `directory`."""

    @classmethod
    def create(cls, directory: str = "/var/tmp", bps: int = 1024 * 1024, reads: bool = False) -> BlkioCgroup:
        root = Path("/sys/fs/cgroup/blkio")
        if not (root / "blkio.throttle.write_bps_device").exists() or not os.access(root, os.W_OK):
            raise FaultSetupError("slow_storage needs a writable cgroup v1 blkio controller (root)")
        dev = os.stat(directory).st_dev
        path = root / f"eroica-io-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        try:
            knob = "blkio.throttle.read_bps_device" if reads else "blkio.throttle.write_bps_device"
            (path / knob).write_text(f"{os.major(dev)}:{os.minor(dev)} {bps}")
        except OSError as exc:
            path.rmdir()
            raise FaultSetupError(
                f"cannot throttle device {os.major(dev)}:{os.minor(dev)} of {directory}: {exc}") from exc
        return cls(path)


@dataclass
class JobResult:
    returncodes: list[int | None]
    logs: dict[int, str]
    wall_seconds: float
    timed_out: bool
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)


def launch(
    out_dir: Path,
    world_size: int = 4,
    fault: str = "none",
    fault_rank: int | str = 1,
    fault_step: int = 25,
    steps: int = 80,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_seconds: float = 240.0,
    throttle_cores: float = 0.12,
    progress: bool = True,
    nic_rate_mbit: float = 300.0,
    storage_bps: int = 1024 * 1024,
    stop_on_failure: bool = True,
    log_dir: Path | None = None,
    master_port: int | None = None,
    module: str = "eroica.lab.workload",
    netns: bool = False,
) -> JobResult:
    """`stop_on_failure`: when one rank exits non-zero, stop the others (as torchrun does); False lets
    them run on (a job whose ranks do not depend on each other). `log_dir`: where each rank's output
    goes (default `out_dir/logs`). `module`: the training script run on each rank (the demo workload, or
    `eroica.lab.workload_lm`, the held-out one). `netns`: every rank in its own network namespace even
    without `nic_degraded` (links of their own, none capped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = log_dir or out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    faults = fault.split(",")
    needs = next((f for f in faults if f in ("cpu_throttled", "cpu_contention")), None)
    cg = CpuCgroups.create(throttle_cores if "cpu_throttled" in faults else None, world_size, needs)
    try:
        # the workload's reads variant (`--storage-fault reads`) throttles the device's reads, not its writes
        args = list(extra_args or [])
        reads = "--storage-fault" in args[:-1] and args[args.index("--storage-fault") + 1] == "reads"
        blkio = BlkioCgroup.create(bps=storage_bps, reads=reads) if "slow_storage" in faults else None
        memcg = MemoryCgroup.create() if "host_memory_pressure" in faults else None
    except Exception:
        cg.cleanup()
        raise
    nets: RankNetworks | None = None
    nic_ranks: set[int] = set()
    if "nic_degraded" in faults or "hang_nic" in faults or netns:
        ok, why = netns_available()
        if not ok:
            cg.cleanup()
            raise FaultSetupError(f"nic_degraded needs one network namespace per rank: {why} (run as root)")
        nic_ranks = {r for f, r in fault_pairs(fault, str(fault_rank)) if f in ("nic_degraded", "hang_nic")}
        try:
            nets = RankNetworks(world_size).create()
        except Exception:
            cg.cleanup()
            raise
    port = master_port or free_port()
    procs: list[subprocess.Popen[bytes]] = []
    handles = []
    t0 = time.monotonic()
    timed_out = False
    try:
        for rank in range(world_size):
            penv = dict(os.environ)
            penv.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
            )
            penv.setdefault(FR_ENV, FR_DEFAULT)     # torch's Flight Recorder, as `eroica run` turns it on
            if cg.throttled is not None:
                penv["EROICA_THROTTLE_CGROUP"] = str(cg.throttled)
            if nets is not None:
                penv.update(MASTER_ADDR=nets.ip(0), GLOO_SOCKET_IFNAME="eth0")
            if blkio is not None:
                penv["EROICA_BLKIO_CGROUP"] = str(blkio.path)
            if memcg is not None:
                penv["EROICA_MEMORY_CGROUP"] = str(memcg.path)
            penv.update(env or {})
            cmd = ([] if nets is None else nets.prefix(rank)) + [
                sys.executable, "-m", module, "--out", str(out_dir),
                "--steps", str(steps), "--fault", fault, "--fault-rank", str(fault_rank),
                "--fault-step", str(fault_step), *(extra_args or []),
            ]
            fh = open(log_dir / f"rank-{rank}.log", "wb")
            handles.append(fh)
            p = subprocess.Popen(cmd, env=penv, stdout=fh, stderr=subprocess.STDOUT)
            cg.add(p.pid, rank)
            procs.append(p)
        seen = 0
        while any(p.poll() is None for p in procs):
            if time.monotonic() - t0 > timeout_seconds:
                timed_out = True
                break
            if progress:
                seen = _echo_progress(log_dir / "rank-0.log", seen)
            for r in sorted(nic_ranks):
                text = (log_dir / f"rank-{r}.log").read_text(errors="replace")
                if nets is not None and "injecting nic_degraded" in text:
                    nets.limit(r, nic_rate_mbit)     # the rank reached the fault step: cap its link now
                    nic_ranks.discard(r)
                elif nets is not None and "injecting hang_nic" in text:
                    nets.down(r)                     # the rank's NIC dies: its collectives never complete
                    nic_ranks.discard(r)
            if stop_on_failure and any(p.poll() not in (None, 0) for p in procs):
                time.sleep(2.0)  # one rank died: give the rest a moment, then stop them
                break
            time.sleep(0.2)
        if progress:
            _echo_progress(log_dir / "rank-0.log", seen)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for fh in handles:
            fh.close()
        cg.cleanup()
        if blkio is not None:
            cg.notes.extend(blkio.cleanup())
        if memcg is not None:
            cg.notes.extend(memcg.cleanup())
        if nets is not None:
            cg.notes.extend(nets.cleanup())
    logs = {r: (log_dir / f"rank-{r}.log").read_text(errors="replace") for r in range(world_size)}
    return JobResult([p.returncode for p in procs], logs, time.monotonic() - t0, timed_out, cg.notes)


def _echo_progress(path: Path, seen: int) -> int:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return seen
    for line in lines[seen:]:
        if line.startswith("[rank"):
            print("  " + line, flush=True)
    return len(lines)
