"""The /proc and /sys sources the hardware sampler reads (each one file or a few, on the local host).

A source reads through a cached descriptor (pread at offset 0 regenerates a /proc file: 3-4x cheaper
than open/read/close). A fast one-file source has `path` and `parse(text)`, so the sampler can read
its bytes on the tick and parse them later in a batch (`eroica.collector.sampler`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


_FDS: dict[str, int] = {}


def _read(path: str) -> str:
    """Read a /proc or /sys file through a cached descriptor (pread at 0 regenerates it: 3-4x
    cheaper than open/read/close, which matters at hundreds of samples per second)."""
    fd = _FDS.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        _FDS[path] = fd
    try:
        return os.pread(fd, 65536, 0).decode()
    except OSError:
        _FDS.pop(path, None)
        os.close(fd)
        raise


def close_cached_files() -> None:
    for fd in _FDS.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _FDS.clear()


@dataclass
class SchedStat:
    """The training thread's on-CPU and run-queue wait time (ns), from schedstat."""

    pid: int
    tid: int
    name: str = "schedstat"
    columns: tuple[str, ...] = ("main_cpu_ns", "main_wait_ns")
    slow: bool = False

    def __post_init__(self) -> None:
        self.path = f"/proc/{self.pid}/task/{self.tid}/schedstat"

    def read(self) -> tuple[float, ...]:
        return self.parse(_read(self.path))

    def parse(self, text: str) -> tuple[float, ...]:
        run, wait, _ = text.split()
        return float(run), float(wait)


@dataclass
class ProcStat:
    """Whole-process CPU (all threads) and page faults, from /proc/self/stat."""

    pid: int
    name: str = "proc_stat"
    columns: tuple[str, ...] = ("proc_cpu_s", "minflt", "majflt")
    slow: bool = False

    def __post_init__(self) -> None:
        self.path = f"/proc/{self.pid}/stat"

    def read(self) -> tuple[float, ...]:
        return self.parse(_read(self.path))

    def parse(self, raw: str) -> tuple[float, ...]:
        _state, minflt, majflt, cpu = stat_fields(raw)
        return cpu, minflt, majflt


def stat_fields(raw: str) -> tuple[str, float, float, float]:
    """A /proc/<pid>/stat line's state, minor and major faults, and CPU seconds (user + system)."""
    fields = raw[raw.rindex(")") + 2 :].split()     # the name may hold spaces and parentheses
    # fields[0] is field 3 (state); minflt=10, majflt=12, utime=14, stime=15 (1-based)
    return fields[0], float(fields[7]), float(fields[9]), (float(fields[11]) + float(fields[12])) / CLK_TCK


@dataclass
class ThreadState:
    """1.0 when the training thread is in uninterruptible sleep (D: waiting for block I/O), else 0."""

    pid: int
    tid: int
    name: str = "thread_state"
    columns: tuple[str, ...] = ("main_in_io",)
    slow: bool = False

    def __post_init__(self) -> None:
        self.path = f"/proc/{self.pid}/task/{self.tid}/stat"

    def read(self) -> tuple[float, ...]:
        return self.parse(_read(self.path))

    def parse(self, raw: str) -> tuple[float, ...]:
        return (1.0 if raw[raw.rindex(")") + 2] == "D" else 0.0,)


@dataclass
class ThreadCtx:
    pid: int
    tid: int
    name: str = "ctx_switches"
    columns: tuple[str, ...] = ("invol_ctx",)
    slow: bool = True

    def read(self) -> tuple[float, ...]:
        for line in _read(f"/proc/{self.pid}/task/{self.tid}/status").splitlines():
            if line.startswith("nonvoluntary_ctxt_switches"):
                return (float(line.split()[1]),)
        raise OSError("nonvoluntary_ctxt_switches missing")


def cgroup_cpu_dir(pid: int | str = "self") -> tuple[Path, int]:
    """The cgroup directory holding a process's CPU controller files, and the cgroup version."""
    v2_path = None
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        hid, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            for root in (Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/cpu")):
                cand = root / path.lstrip("/")
                if (cand / "cpu.stat").exists():
                    return cand, 1
        if hid == "0" and controllers == "":
            v2_path = path
    if v2_path is not None:
        for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            cand = root / v2_path.lstrip("/")
            if (cand / "cpu.stat").exists() and "throttled" in _read(str(cand / "cpu.stat")):
                return cand, 2
    raise OSError("no cgroup cpu controller with cpu.stat found for this process")


@dataclass
class CgroupCpu:
    """CFS throttling counters of this process's cgroup (v1 or v2)."""

    pid: int
    name: str = "cgroup_cpu"
    columns: tuple[str, ...] = ("cg_nr_throttled", "cg_throttled_ns")
    slow: bool = False

    def __post_init__(self) -> None:
        self.directory, self.version = cgroup_cpu_dir(self.pid)
        self.path = str(self.directory / "cpu.stat")

    def quota_cores(self) -> float | None:
        if self.version == 1:
            quota = int(_read(str(self.directory / "cpu.cfs_quota_us")))
            period = int(_read(str(self.directory / "cpu.cfs_period_us")))
            return None if quota < 0 else quota / period
        quota_s, period_s = _read(str(self.directory / "cpu.max")).split()
        return None if quota_s == "max" else int(quota_s) / int(period_s)

    def read(self) -> tuple[float, ...]:
        return self.parse(_read(self.path))

    def parse(self, text: str) -> tuple[float, ...]:
        vals = dict(line.split() for line in text.splitlines() if line.strip())
        if self.version == 1:
            return float(vals["nr_throttled"]), float(vals["throttled_time"])
        return float(vals["nr_throttled"]), float(vals["throttled_usec"]) * 1000.0


MAX_CGROUP_NEIGHBOURS = 32     # processes read per sample; a crowded cgroup is read in part


@dataclass
class CgroupOthers:
    """CPU seconds used by the other processes of this rank's CPU cgroup (its container): its loader
    workers, and whatever else runs there. A counter over the window: each process counts from its
    first sighting (its CPU before then is not the window's), and a process that exits keeps what
    it used. Read every SLOW_EVERY samples."""

    pid: int
    name: str = "cgroup_others"
    columns: tuple[str, ...] = ("cg_others_cpu_s", "cg_others_procs")
    slow: bool = True

    def __post_init__(self) -> None:
        directory, _ = cgroup_cpu_dir(self.pid)
        if (directory / "cgroup.sane_behavior").exists() or directory == Path("/sys/fs/cgroup"):
            # the hierarchy's root: the process has no container; the host's load is host_cpu's
            raise OSError(f"the process is in the root CPU cgroup ({directory}): no container of its own")
        self.procs_path = directory / "cgroup.procs"
        self.seen: dict[int, float] = {}
        self.total = 0.0

    def read(self) -> tuple[float, ...]:
        pids = [int(x) for x in self.procs_path.read_text().split()]
        # the helper reading this is eroica's, not a neighbour (the host helper may share the cgroup)
        others = [p for p in pids if p != self.pid and p != os.getpid()][:MAX_CGROUP_NEIGHBOURS]
        for p in others:
            try:
                raw = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue                       # it exited between the listing and the read
            f = raw[raw.rindex(")") + 2 :].split()
            cpu = (float(f[11]) + float(f[12])) / CLK_TCK
            if p in self.seen:
                self.total += max(cpu - self.seen[p], 0.0)
            self.seen[p] = cpu
        return self.total, float(len(others))


@dataclass
class CgroupMemory:
    """Usage against the limit of the process's memory cgroup, and how often the limit was hit."""

    pid: int
    name: str = "cgroup_memory"
    columns: tuple[str, ...] = ("cg_mem_usage_ratio", "cg_mem_limit_hits")
    slow: bool = True

    def __post_init__(self) -> None:
        path = None
        for line in _read(f"/proc/{self.pid}/cgroup").splitlines():
            hid, controllers, p = line.split(":", 2)
            if "memory" in controllers.split(","):
                path = Path("/sys/fs/cgroup/memory") / p.lstrip("/")
            elif hid == "0" and controllers == "" and path is None:
                cand = Path("/sys/fs/cgroup") / p.lstrip("/")
                if (cand / "memory.current").exists():
                    path = cand
        if path is None or not path.exists():
            raise OSError("no memory cgroup found for this process")
        self.v1 = (path / "memory.usage_in_bytes").exists()
        self.path = path

    def read(self) -> tuple[float, ...]:
        if self.v1:
            usage = float(_read(str(self.path / "memory.usage_in_bytes")))
            limit = float(_read(str(self.path / "memory.limit_in_bytes")))
            hits = float(_read(str(self.path / "memory.failcnt")))
        else:
            usage = float(_read(str(self.path / "memory.current")))
            raw = _read(str(self.path / "memory.max")).strip()
            limit = float("inf") if raw == "max" else float(raw)
            events = dict(line.split() for line in _read(str(self.path / "memory.events")).splitlines())
            hits = float(events.get("max", 0))
        return (usage / limit if limit > 0 else 0.0), hits


@dataclass
class ProcMem:
    pid: int
    name: str = "memory"
    columns: tuple[str, ...] = ("rss_bytes", "swap_bytes")
    slow: bool = True

    def read(self) -> tuple[float, ...]:
        rss = swap = 0.0
        for line in _read(f"/proc/{self.pid}/status").splitlines():
            if line.startswith("VmRSS:"):
                rss = float(line.split()[1]) * 1024
            elif line.startswith("VmSwap:"):
                swap = float(line.split()[1]) * 1024
        return rss, swap


@dataclass
class ProcIO:
    pid: int
    name: str = "disk_io"
    columns: tuple[str, ...] = ("io_read_bytes", "io_write_bytes")
    slow: bool = True

    def read(self) -> tuple[float, ...]:
        vals = dict(line.split(": ") for line in _read(f"/proc/{self.pid}/io").splitlines())
        return float(vals["read_bytes"]), float(vals["write_bytes"])


@dataclass
class SystemCpu:
    """All-core and per-core busy jiffies from /proc/stat (per-core util over the window)."""

    name: str = "system_cpu"
    columns: tuple[str, ...] = ("sys_busy", "sys_total")
    slow: bool = True
    per_core_first: list[tuple[float, float]] = field(default_factory=list)
    per_core_last: list[tuple[float, float]] = field(default_factory=list)

    def read(self) -> tuple[float, ...]:
        rows = []
        for line in _read("/proc/stat").splitlines():
            if not line.startswith("cpu"):
                break
            parts = line.split()
            vals = [float(x) for x in parts[1:9]]
            idle = vals[3] + vals[4]
            rows.append((sum(vals) - idle, sum(vals)))
        self.per_core_last = rows[1:]
        if not self.per_core_first:
            self.per_core_first = rows[1:]
        return rows[0]

    def per_core_util(self) -> list[float]:
        out = []
        for (b0, t0), (b1, t1) in zip(self.per_core_first, self.per_core_last):
            out.append(round((b1 - b0) / (t1 - t0), 4) if t1 > t0 else 0.0)
        return out


@dataclass
class NetDev:
    """Per-interface rx+tx byte counters from /proc/net/dev (loopback included: gloo uses it)."""

    pid: int
    name: str = "nic"
    slow: bool = False
    interfaces: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.path = f"/proc/{self.pid}/net/dev"
        if not self.interfaces:
            self.interfaces = tuple(sorted(self._counters(_read(self.path))))
        self.columns = tuple(f"nic:{i}" for i in self.interfaces)

    @staticmethod
    def _counters(text: str) -> dict[str, float]:
        out = {}
        for line in text.splitlines()[2:]:
            name, rest = line.split(":", 1)
            f = rest.split()
            out[name.strip()] = float(f[0]) + float(f[8])
        return out

    def read(self) -> tuple[float, ...]:
        return self.parse(_read(self.path))

    def parse(self, text: str) -> tuple[float, ...]:
        d = self._counters(text)
        return tuple(d.get(i, 0.0) for i in self.interfaces)
