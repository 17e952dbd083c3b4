"""A rank's DataLoader worker processes, sampled in the window like the rank itself.

A fault in the input pipeline lives in the loader's worker processes, not in the rank: a worker's
reads are slow, its memory cgroup is too small, or it waits for a CPU. The rank's own counters show
none of it, and prefetching hides most of the wait. This source follows the work to the processes
doing it.

Which processes are workers: the rank's direct children that run the rank's own program (a forked
worker keeps its parent's command line) or multiprocessing's spawn or forkserver entry point. A
process the rank starts with `subprocess` runs another program and is not a worker (a co-located
service is the CPU cgroup's business, `CgroupOthers`). Children are listed from
`/proc/<pid>/task/<tid>/children` of every thread of the rank, again every `RESCAN_EVERY` reads, so
workers started mid-window (non-persistent loaders start theirs at every epoch) are followed.

What a worker is doing, at each read, from its state and, when it sleeps, the kernel function it
sleeps in (`/proc/<pid>/wchan`):
- idle: asleep waiting for its next index (poll, select, a pipe, a futex: the loader's queues);
- busy: running or runnable (R), in uninterruptible I/O (D), or asleep anywhere else (a timer, a
  socket, a page being read): working on a batch, or waiting for something outside the loader.
The kernel functions of the busy-asleep samples are counted, so the report can say where the
workers wait. A worker that waits on a network service through poll counts as idle: the signal errs
towards saying nothing, never towards a wrong finding.

Counters (CPU, run-queue wait, major faults, bytes read) count from a worker's first sighting and a
worker that exits keeps what it used, as in `CgroupOthers`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from eroica.collector.proc_sources import stat_fields

MAX_WORKERS = 32            # workers read per sample; a loader with more is read in part
RESCAN_EVERY = 5            # reads between listings of the rank's children
IDLE_WCHAN = ("poll", "select", "pipe", "futex", "ep_wait")   # waiting on the loader's own queues
TOP_WAITS = 3               # kernel functions named in the summary


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read()


def is_worker(cmdline: bytes, parent_cmdline: bytes) -> bool:
    """A forked worker runs its parent's command line; a spawned or forkserver one multiprocessing's."""
    return cmdline == parent_cmdline or b"multiprocessing" in cmdline


def children(pid: int) -> list[int]:
    """The direct children of every thread of `pid` (a thread that forked a worker holds it)."""
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except OSError:
            continue                       # the thread exited between the listing and the read
    return out


def busy(state: str, wchan: str) -> bool:
    if state in ("R", "D"):
        return True
    if state != "S":
        return False                       # stopped, traced, zombie: not working on a batch
    return not any(w in wchan for w in IDLE_WCHAN)


@dataclass
class _Seen:
    cpu_s: float
    wait_ns: float
    majflt: float
    read_bytes: float


@dataclass
class LoaderWorkers:
    """The rank's loader workers at each read: how many, how many busy, on a CPU, in D state; and
    counters over the window: their CPU seconds, run-queue wait, major faults and bytes read."""

    pid: int
    name: str = "loader_workers"
    columns: tuple[str, ...] = ("lw_workers", "lw_busy", "lw_on_cpu", "lw_in_io",
                                "lw_cpu_s", "lw_wait_ns", "lw_majflt", "lw_read_bytes")
    slow: bool = True
    waits: Counter[str] = field(default_factory=Counter)    # busy-asleep samples by kernel function
    busy_samples: int = 0

    def __post_init__(self) -> None:
        self.parent = _cmdline(self.pid)
        self.workers: list[int] = []
        self.seen: dict[int, _Seen] = {}
        self.totals = [0.0, 0.0, 0.0, 0.0]
        self.reads = 0

    def _rescan(self) -> None:
        found = []
        for child in children(self.pid):
            try:
                if is_worker(_cmdline(child), self.parent):
                    found.append(child)
            except OSError:
                continue
        self.workers = sorted(found)[:MAX_WORKERS]

    def read(self) -> tuple[float, ...]:
        if self.reads % RESCAN_EVERY == 0:
            self._rescan()
        self.reads += 1
        n = n_busy = on_cpu = in_io = 0
        alive = []
        for w in self.workers:
            try:
                sample = self._one(w)
            except (OSError, ValueError, IndexError):
                continue                   # it exited: its counters stay in the totals
            alive.append(w)
            state, wchan = sample
            n += 1
            on_cpu += state == "R"
            in_io += state == "D"
            if busy(state, wchan):
                n_busy += 1
                self.busy_samples += 1
                if state == "S":
                    # "0": it woke between the two reads (the kernel names no wait of a running task)
                    self.waits["running" if wchan == "0" else wchan or "?"] += 1
        self.workers = alive
        return (float(n), float(n_busy), float(on_cpu), float(in_io), *self.totals)

    def _one(self, w: int) -> tuple[str, str]:
        with open(f"/proc/{w}/stat") as fh:
            raw = fh.read()
        state, _minflt, majflt, cpu = stat_fields(raw)
        with open(f"/proc/{w}/schedstat") as fh:
            wait = float(fh.read().split()[1])
        read_bytes = 0.0
        try:
            with open(f"/proc/{w}/io") as fh:
                for line in fh:
                    if line.startswith("read_bytes:"):
                        read_bytes = float(line.split()[1])
        except OSError:
            pass                           # another user's worker: its I/O counters are closed to us
        wchan = ""
        if state == "S":
            try:
                with open(f"/proc/{w}/wchan") as fh:
                    wchan = fh.read().strip()
            except OSError:
                wchan = "?"
        now = _Seen(cpu, wait, majflt, read_bytes)
        before = self.seen.get(w)
        if before is not None:
            for i, (a, b) in enumerate(((now.cpu_s, before.cpu_s), (now.wait_ns, before.wait_ns),
                                        (now.majflt, before.majflt), (now.read_bytes, before.read_bytes))):
                self.totals[i] += max(a - b, 0.0)
        self.seen[w] = now
        return state, wchan

    def blocked_in(self) -> dict[str, float]:
        """The kernel functions the busy workers slept in, as a share of their busy samples (top few)."""
        if not self.busy_samples:
            return {}
        return {k: round(v / self.busy_samples, 4) for k, v in self.waits.most_common(TOP_WAITS)}
