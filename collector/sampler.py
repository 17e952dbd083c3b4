"""Hardware sampler: a background thread reading /proc, /sys and psutil on the local monotonic clock.

Each source is read behind a guard: a source that fails is recorded once as a `CollectorGap`
and not read again in this window. Samples go into preallocated numpy arrays (a hard cap),
so memory is bounded whatever the window length.

A fast source that reads one file (`path`, `parse(text)`) is read raw on its tick and parsed with
the next BATCH ticks' bytes: after a 20 ms sleep the training job has evicted the sampler's code
and data from the caches, and parsing on every tick paid those misses once per source per tick
(docs/benchmarks.md, "Costs behind design choices"). The values are the same.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from eroica.collector.loader_workers import LoaderWorkers
from eroica.collector.proc_sources import (
    CgroupCpu,
    CgroupMemory,
    CgroupOthers,
    NetDev,
    ProcIO,
    ProcMem,
    ProcStat,
    SchedStat,
    SystemCpu,
    ThreadCtx,
    ThreadState,
)
from eroica.schema.patterns import CollectorGap

SLOW_EVERY = 10  # heavier sources are read every SLOW_EVERY samples
BATCH = 32       # ticks of raw bytes held before they are parsed (~1.5 KB a tick)


class Source(Protocol):
    name: str
    columns: tuple[str, ...]
    slow: bool

    def read(self) -> tuple[float, ...]: ...


@runtime_checkable
class FileSource(Source, Protocol):
    """A source that is one file: read() is parse(the file's text)."""

    path: str

    def parse(self, text: str) -> tuple[float, ...]: ...


@dataclass
class SampleSeries:
    """What one window's sampling produced: column -> array, aligned on `t_ns` (monotonic)."""

    t_ns: np.ndarray
    columns: dict[str, np.ndarray]
    gaps: list[CollectorGap]
    interval_seconds: float
    sampler_cpu_seconds: float
    dropped_total: int
    extras: dict[str, object] = field(default_factory=dict)


class Ticker:
    """One thread that ticks every sampler added to it each `interval` seconds (with `duty` < 1: in
    bursts of `burst` seconds, a `duty` share of the time, the pauses drawn at random so that a fixed
    period cannot keep meeting the same part of a periodic step). The host helper ticks every local
    rank's sampler on one ticker: one wake-up per tick for the host instead of one per rank. Its CPU
    (the wake-up and the reads) is split evenly between the samplers it ticked."""

    def __init__(self, interval: float, duty: float = 1.0, burst: float = 0.05, name: str = "eroica-sampler") -> None:
        self.interval, self.duty, self.burst, self.name = interval, duty, burst, name
        self._lock = threading.Lock()
        self._samplers: list[HardwareSampler] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, s: HardwareSampler) -> None:
        with self._lock:
            self._samplers.append(s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, s: HardwareSampler, timeout: float = 2.0) -> bool:
        """Take `s` off the ticker after its final sample; False when a tick did not end in time."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if s in self._samplers:
                self._samplers.remove(s)
                s._finish()
        finally:
            self._lock.release()
        return True

    def close(self, timeout: float = 2.0) -> bool:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        rng = random.Random(os.getpid() ^ threading.get_native_id())
        cpu = time.thread_time()
        next_t = time.monotonic()
        burst_end = next_t + self.burst
        while not self._stop.is_set():
            with self._lock:
                ticked = list(self._samplers)
                for s in ticked:
                    s._tick()
                now_cpu = time.thread_time()
                for s in ticked:                  # the wake-up since the last tick and the reads, shared
                    s._cpu += (now_cpu - cpu) / len(ticked)
                cpu = now_cpu
            if not ticked:
                self._wake.wait()
                self._wake.clear()
                cpu = time.thread_time()
                next_t = time.monotonic()
                burst_end = next_t + self.burst
                continue
            next_t += self.interval
            if self.duty < 1.0 and next_t >= burst_end:
                next_t = burst_end + self.burst * (1.0 / self.duty - 1.0) * rng.uniform(0.5, 1.5)
                burst_end = next_t + self.burst
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t = time.monotonic()
                delay = 0
            # a plain sleep costs a third less CPU per wake-up than a timed Event.wait; a stop is
            # seen within one interval, or at once in a pause between bursts
            if delay > 2 * self.interval:
                self._stop.wait(delay)
            else:
                time.sleep(delay)


class HardwareSampler:
    """Samples every `interval` seconds between start() and stop(); at most `capacity` samples.
    On its own thread, or on a shared `ticker` (the host helper's, one per interval)."""

    def __init__(self, sources: list[Source], interval: float, capacity: int = 20_000, duty: float = 1.0,
                 burst: float = 0.05, ticker: Ticker | None = None) -> None:
        self.sources = sources
        self.interval = interval
        self.capacity = capacity
        self.gaps: list[CollectorGap] = []
        # a sampler alone has a ticker of its own (its thread starts at start(), ends at stop())
        self._owns_ticker = ticker is None
        self._ticker = Ticker(interval, duty, burst) if ticker is None else ticker
        self._n = 0
        self._i = 0
        self._dropped = 0
        self._cpu = 0.0
        self._opened = False
        cols = [c for s in sources for c in s.columns]
        self._t = np.zeros(capacity, dtype=np.int64)
        self._data = {c: np.full(capacity, np.nan) for c in cols}
        self._dead: set[str] = set()
        # fast one-file sources, read raw through their own descriptors (opened on the ticking thread)
        self._raw: list[FileSource] = []
        self._fds: list[int] = []
        self._pending: list[tuple[int, list[bytes]]] = []
        self._others = list(sources)

    def _fail(self, src: Source, what: str, exc: BaseException) -> None:
        """A broken source becomes a gap, never an exception, and is not read again."""
        self._dead.add(src.name)
        self.gaps.append(CollectorGap(source=src.name, reason=f"{what}: {exc!r}"[:200]))

    def _open_raw(self) -> None:
        for src in self.sources:
            if src.slow or not isinstance(src, FileSource):
                continue
            try:
                self._fds.append(os.open(src.path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                self._fail(src, "read failed", exc)
                continue
            self._raw.append(src)
        self._others = [s for s in self.sources if s not in self._raw and s.name not in self._dead]

    def _close_raw(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._raw, self._fds = [], []

    def _drop_dead(self) -> None:
        """Stop reading the raw sources that failed (their descriptors closed)."""
        keep = []
        for src, fd in zip(self._raw, self._fds):
            if src.name in self._dead:
                os.close(fd)
            else:
                keep.append((src, fd))
        self._raw, self._fds = [s for s, _ in keep], [fd for _, fd in keep]

    def _parse_pending(self) -> None:
        """Parse the held raw ticks, one source at a time (its code stays warm through the batch)."""
        pending, self._pending = self._pending, []
        for k, src in enumerate(self._raw):
            arrays = [self._data[c] for c in src.columns]
            try:
                for idx, row in pending:
                    for a, v in zip(arrays, src.parse(row[k].decode())):
                        a[idx] = v
            except Exception as exc:            # the ticks before it keep their values
                self._fail(src, "read failed", exc)
        self._drop_dead()

    def _read_raw(self, idx: int) -> None:
        pread = os.pread
        try:
            row = [pread(fd, 65536, 0) for fd in self._fds]
        except OSError:
            self._parse_pending()               # the held ticks still have every source
            row = []
            for src, fd in zip(self._raw, self._fds):
                try:
                    row.append(pread(fd, 65536, 0))
                except OSError as exc:
                    self._fail(src, "read failed", exc)
            self._drop_dead()                   # the row holds the sources that are left, in order
        self._pending.append((idx, row))
        if len(self._pending) >= BATCH:
            self._parse_pending()

    def _sample_once(self, idx: int, slow: bool) -> None:
        self._t[idx] = time.monotonic_ns()
        if self._fds:
            self._read_raw(idx)
        for src in self._others:
            if src.name in self._dead or (src.slow and not slow):
                continue
            try:
                vals = src.read()
            except Exception as exc:  # a broken source becomes a gap, never an exception
                self._fail(src, "read failed", exc)
                continue
            for col, v in zip(src.columns, vals):
                self._data[col][idx] = v

    def _ensure_open(self) -> None:
        if not self._opened:
            self._opened = True
            self._open_raw()

    def _tick(self) -> None:
        """One sample (every SLOW_EVERY-th one with the slow sources), on the ticking thread."""
        self._ensure_open()
        if self._n >= self.capacity:
            self._dropped += 1
        else:
            self._sample_once(self._n, slow=(self._i % SLOW_EVERY == 0))
            self._n += 1
        self._i += 1

    def _finish(self) -> None:
        """A final full sample closes the window; the held raw ticks are parsed, the descriptors closed."""
        c0 = time.thread_time()
        self._ensure_open()
        if self._n < self.capacity:
            self._sample_once(self._n, slow=True)
            self._n += 1
        self._parse_pending()
        self._close_raw()
        self._cpu += time.thread_time() - c0

    @property
    def ticks(self) -> int:
        """Ticks so far: the samples taken plus those dropped at capacity."""
        return self._i

    def start(self) -> None:
        self._ticker.add(self)

    def stop(self, timeout: float = 2.0) -> SampleSeries:
        done = self._ticker.remove(self, timeout)
        if self._owns_ticker:
            done = self._ticker.close(timeout) and done
        if not done:
            self.gaps.append(CollectorGap(source="sampler", reason="sampler thread did not stop in time"))
        n = self._n
        return SampleSeries(
            t_ns=self._t[:n].copy(),
            columns={c: a[:n].copy() for c, a in self._data.items()},
            gaps=list(self.gaps),
            interval_seconds=self.interval,
            sampler_cpu_seconds=self._cpu,
            dropped_total=self._dropped,
        )


def _nvml(index: int | None = None) -> Source:
    from eroica.collector.nvml import open_nvml_source

    return open_nvml_source(index)


def _nvlink(index: int | None = None) -> Source:
    from eroica.collector.nvml import open_nvlink_source

    return open_nvlink_source(index)


def _xid(index: int | None = None) -> Source:
    from eroica.collector.nvml import open_xid_source

    return open_xid_source(index)


def default_sources(pid: int, main_tid: int, gpu_index: int | None = None) -> tuple[list[Source], list[CollectorGap]]:
    """Every source this machine offers for process `pid` (training thread `main_tid`, GPU `gpu_index`:
    by default the one this process's LOCAL_RANK maps to); the ones that cannot even be set up become gaps."""
    sources: list[Source] = []
    gaps: list[CollectorGap] = []
    factories = [
        ("schedstat", lambda: SchedStat(pid, main_tid)),
        ("proc_stat", lambda: ProcStat(pid)),
        ("thread_state", lambda: ThreadState(pid, main_tid)),
        ("ctx_switches", lambda: ThreadCtx(pid, main_tid)),
        ("cgroup_cpu", lambda: CgroupCpu(pid)),
        ("cgroup_others", lambda: CgroupOthers(pid)),
        ("memory", lambda: ProcMem(pid)),
        ("cgroup_memory", lambda: CgroupMemory(pid)),
        ("disk_io", lambda: ProcIO(pid)),
        ("loader_workers", lambda: LoaderWorkers(pid)),
        ("system_cpu", SystemCpu),
        ("nic", lambda: NetDev(pid)),
        ("nvml", lambda: _nvml(gpu_index)),
        ("nvlink", lambda: _nvlink(gpu_index)),
        ("xid", lambda: _xid(gpu_index)),
    ]
    for name, make in factories:
        try:
            src: Any = make()
            src.read()
            sources.append(src)
            for missing in getattr(src, "unavailable", []):
                gaps.append(CollectorGap(source=name, reason=f"field unavailable: {missing}"))
        except Exception as exc:
            gaps.append(CollectorGap(source=name, reason=f"unavailable: {exc!r}"[:200]))
    return sources, gaps
