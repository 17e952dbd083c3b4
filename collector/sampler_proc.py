"""Out-of-process hardware sampling.

A sampler thread inside the training process competes for the GIL: under a busy training loop
each /proc read waits for the interpreter's switch interval, and a 5 ms sampler delivers a
sample every ~40 ms. So the sampler runs in a small helper process (no torch import) that reads
/proc/<pid>/... of the training process on the same system-wide monotonic clock. This module is
a rank's own helper (`sampler_scope="rank"`, or a rank's fallback from the host's one helper,
`host_sampler`, which runs the same `RankSampling` for every local rank): started once per
Monitor, it sleeps on a pipe between windows (no CPU), and exits when the pipe closes.

Protocol on the helper's stdin/stdout: `start <interval_s> <capacity> [<nic_interval_s> <nic_duty>]\\n`
-> `ok\\n`;
`stop\\n` -> 8-byte big-endian length + pickle of the series; `quit\\n` or EOF -> exit.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable

from eroica.collector.loader_workers import LoaderWorkers
from eroica.collector.netlinks import job_interfaces
from eroica.collector.proc_sources import NetDev, SystemCpu, close_cached_files
from eroica.collector.sampler import HardwareSampler, SampleSeries, Ticker, default_sources
from eroica.schema.patterns import CollectorGap


def _series_to_dict(s: SampleSeries) -> dict:
    return {
        "t_ns": s.t_ns,
        "columns": s.columns,
        "gaps": [g.model_dump() for g in s.gaps],
        "interval_seconds": s.interval_seconds,
        "sampler_cpu_seconds": s.sampler_cpu_seconds,
        "dropped_total": s.dropped_total,
        "extras": s.extras,
    }


HELPER_NICE = 10     # the helper yields to the training process when they compete for a CPU

TickerFor = Callable[[float, float], Ticker]    # (interval, duty) -> the shared ticker for them


class RankSampling:
    """One rank's sampling inside a helper: its sources, its sampler and its fast NIC sampler. In the
    rank's own helper each runs on its own thread; in the host helper on tickers shared by the
    host's ranks (`tickers`)."""

    def __init__(self, pid: int, tid: int, gpu_index: int | None = None) -> None:
        self.pid, self.tid, self.gpu_index = pid, tid, gpu_index
        self.sampler: HardwareSampler | None = None
        self.fast: HardwareSampler | None = None
        self.setup_gaps: list[CollectorGap] = []
        self.quota: float | None = None

    def start(self, interval: float, capacity: int, nic_interval: float, nic_duty: float,
              tickers: TickerFor | None = None) -> None:
        sources, self.setup_gaps = default_sources(self.pid, self.tid, self.gpu_index)
        self.quota = None
        for src in sources:
            if src.name == "cgroup_cpu":
                try:
                    self.quota = getattr(src, "quota_cores")()   # only the cgroup_cpu source has it
                except Exception as exc:
                    self.setup_gaps.append(CollectorGap(source="cgroup_quota", reason=repr(exc)[:200]))
        self.sampler = HardwareSampler(sources, interval, capacity,
                                       ticker=tickers(interval, 1.0) if tickers else None)
        self.sampler.start()
        self.fast = None
        if nic_interval > 0:
            try:
                # link signatures need ~1 kHz: the byte counters of the links the job's connections
                # use, on their own thread; a job that talks over loopback only has no link to sample
                links = sorted(job_interfaces(self.pid) - {"lo"})
                if links:
                    self.fast = HardwareSampler([NetDev(self.pid, interfaces=tuple(links))], nic_interval,
                                                capacity * 10, duty=nic_duty,
                                                ticker=tickers(nic_interval, nic_duty) if tickers else None)
                    self.fast.start()
                else:
                    self.setup_gaps.append(CollectorGap(source="nic_fast", reason="the job's connections all use "
                                                        "loopback: no per-rank link to sample fast"))
            except Exception as exc:
                self.setup_gaps.append(CollectorGap(source="nic_fast", reason=repr(exc)[:200]))

    @property
    def running(self) -> bool:
        return self.sampler is not None

    def stop(self) -> bytes:
        """The window's series, pickled for the rank (8-byte big-endian length first)."""
        assert self.sampler is not None
        sampler, self.sampler = self.sampler, None
        series = sampler.stop()
        series.gaps = self.setup_gaps + series.gaps
        if self.fast is not None:
            fs = self.fast.stop()
            cols = [c for c in fs.columns if c.startswith("nic:")]
            series.extras["nic_fast_t_ns"] = fs.t_ns
            series.extras["nic_fast_bytes"] = sum(fs.columns[c] for c in cols) if cols else None
            series.extras["nic_fast_interval_seconds"] = fs.interval_seconds
            series.sampler_cpu_seconds += fs.sampler_cpu_seconds
            self.fast = None
        series.extras["cgroup_cpu_quota_cores"] = self.quota
        for src in sampler.sources:
            if isinstance(src, SystemCpu):
                series.extras["per_core_util_ratio"] = src.per_core_util()
            elif isinstance(src, LoaderWorkers):
                series.extras["loader_worker_blocked_in"] = src.blocked_in()
        blob = pickle.dumps(_series_to_dict(series), protocol=pickle.HIGHEST_PROTOCOL)
        return struct.pack(">Q", len(blob)) + blob


def read_exact(fd: int, n: int, deadline: float, who: str) -> bytes:
    """n bytes from a helper's pipe or socket by `deadline`: a TimeoutError or EOFError naming `who`."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"{who} did not answer in time")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError(f"{who} exited")
        buf += chunk
    return bytes(buf)


def read_series(fd: int, deadline: float, who: str) -> SampleSeries:
    """What `RankSampling.stop` wrote: 8-byte big-endian length, then the pickled series."""
    (n,) = struct.unpack(">Q", read_exact(fd, 8, deadline, who))
    d = pickle.loads(read_exact(fd, n, deadline, who))
    return SampleSeries(
        t_ns=d["t_ns"],
        columns=d["columns"],
        gaps=[CollectorGap(**g) for g in d["gaps"]],
        interval_seconds=d["interval_seconds"],
        sampler_cpu_seconds=d["sampler_cpu_seconds"],
        dropped_total=d["dropped_total"],
        extras=d["extras"],
    )


def helper_main(pid: int, tid: int) -> None:
    out = sys.stdout.buffer
    try:
        os.nice(HELPER_NICE)
    except OSError:
        pass
    rank = RankSampling(pid, tid)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "start":
            rank.start(float(cmd[1]), int(cmd[2]), float(cmd[3]) if len(cmd) > 3 else 0.0,
                       float(cmd[4]) if len(cmd) > 4 else 1.0)
            out.write(b"ok\n")
            out.flush()
        elif cmd[0] == "stop" and rank.running:
            out.write(rank.stop())
            out.flush()
            close_cached_files()
        elif cmd[0] == "quit":
            break


WHO = "sampler helper"


class SamplerClient:
    """The training process's handle on the helper. Every failure is a gap, never an exception."""

    def __init__(self, pid: int, tid: int, timeout_seconds: float = 5.0) -> None:
        self.pid, self.tid, self.timeout = pid, tid, timeout_seconds
        self.proc: subprocess.Popen[bytes] | None = None
        self.gaps: list[CollectorGap] = []
        self._running = False
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eroica.collector.sampler_proc", str(pid), str(tid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except Exception as exc:
            self.gaps.append(CollectorGap(source="sampler", reason=f"helper did not start: {exc!r}"[:200]))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _out(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def _fail(self, what: str, exc: BaseException) -> None:
        self.gaps.append(CollectorGap(source="sampler", reason=f"{what}: {exc!r}"[:200]))
        self.close()

    def start(self, interval: float, capacity: int, nic_interval: float = 0.0, nic_duty: float = 1.0) -> bool:
        if not self.alive:
            return False
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"start {interval} {capacity} {nic_interval} {nic_duty}\n".encode())
            self.proc.stdin.flush()
            line = read_exact(self._out(), 3, time.monotonic() + self.timeout, WHO)
            if line != b"ok\n":
                raise RuntimeError(f"unexpected answer {line!r}")
            self._running = True
            return True
        except Exception as exc:
            self._fail("start failed", exc)
            return False

    def stop(self) -> SampleSeries | None:
        if not (self.alive and self._running):
            return None
        assert self.proc is not None and self.proc.stdin is not None
        self._running = False
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
            return read_series(self._out(), time.monotonic() + self.timeout, WHO)
        except Exception as exc:
            self._fail("stop failed", exc)
            return None

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2)
        except Exception:
            proc.kill()
            proc.wait(timeout=2)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


if __name__ == "__main__":
    helper_main(int(sys.argv[1]), int(sys.argv[2]))
