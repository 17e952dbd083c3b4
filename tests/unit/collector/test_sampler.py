"""Real /proc readings, through the same out-of-process helper the Monitor uses."""

import os
import threading
import time

import numpy as np
from polling import until

from eroica.collector.proc_sources import SchedStat
from eroica.collector.sampler import HardwareSampler, default_sources
from eroica.collector.sampler_proc import SamplerClient
from eroica.collector.summarize import hardware_summary
from eroica.schema.patterns import CollectorGap


def busy(seconds: float) -> None:
    t = time.monotonic()
    x = 0
    while time.monotonic() - t < seconds:
        x += 1


def test_every_source_reads_on_this_machine() -> None:
    sources, gaps = default_sources(os.getpid(), threading.get_native_id())
    names = {s.name for s in sources}
    assert {"schedstat", "proc_stat", "memory", "nic", "system_cpu"} <= names
    assert all(isinstance(g, CollectorGap) for g in gaps)


def test_helper_samples_the_training_thread_while_it_holds_the_gil() -> None:
    client = SamplerClient(os.getpid(), threading.get_native_id())
    try:
        assert client.start(0.005, 5000)
        busy(0.4)
        series = client.stop()
    finally:
        client.close()
    assert series is not None
    # the helper is a separate process: it keeps sampling while this thread spins
    assert len(series.t_ns) >= 25
    assert np.all(np.diff(series.t_ns) > 0)
    hw = hardware_summary(series, 0.4)
    assert hw.cpu_util_ratio is not None and hw.cpu_util_ratio > 0.3   # the spinning thread is on CPU
    assert hw.rss_bytes and hw.rss_bytes > 1e6


def test_a_failing_source_becomes_a_gap_not_an_exception() -> None:
    class Broken:
        name = "broken"
        columns = ("x",)
        slow = False

        def read(self) -> tuple[float, ...]:
            raise OSError("device gone")

    good = SchedStat(os.getpid(), threading.get_native_id())
    s = HardwareSampler([Broken(), good], 0.002, capacity=50)
    s.start()
    until(lambda: s.ticks >= 10, 10, "ten ticks")
    series = s.stop()
    assert [g.source for g in series.gaps] == ["broken"]
    assert np.isfinite(series.columns["main_cpu_ns"]).sum() >= 5


def test_sampler_memory_is_capped() -> None:
    s = HardwareSampler([SchedStat(os.getpid(), threading.get_native_id())], 0.0005, capacity=20)
    s.start()
    until(lambda: s.ticks >= 40, 10, "twice the capacity in ticks")
    series = s.stop()
    assert len(series.t_ns) == 20
    assert series.dropped_total > 0


def test_client_reports_a_dead_helper_as_a_gap() -> None:
    client = SamplerClient(os.getpid(), threading.get_native_id())
    assert client.proc is not None
    client.proc.kill()
    client.proc.wait()
    assert client.start(0.01, 100) is False
    client.close()


class Counter:
    """A one-file source over a file this test rewrites: every tick's value is known."""

    def __init__(self, path: str, name: str = "counter") -> None:
        self.path, self.name, self.columns, self.slow = path, name, (f"{name}_n", f"{name}_twice"), False

    def read(self) -> tuple[float, ...]:
        with open(self.path) as fh:
            return self.parse(fh.read())

    def parse(self, text: str) -> tuple[float, ...]:
        n = float(text.split()[0])
        if n < 0:
            raise ValueError(f"negative count {n}")
        return n, 2 * n


def test_one_file_sources_read_raw_on_the_tick_and_parsed_in_batches_keep_every_value(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """More ticks than a batch: each tick's bytes are parsed later into that tick's row, and a source
    whose text stops parsing becomes a gap from then on while the others keep their samples."""
    from eroica.collector import sampler as sampler_mod

    a, b = tmp_path / "a", tmp_path / "b"
    fa, fb = (os.open(p, os.O_RDWR | os.O_CREAT) for p in (a, b))
    for fd in (fa, fb):                                   # fixed width, one pwrite: never seen half-written
        os.pwrite(fd, b"%08d\n" % 0, 0)
    good, bad = Counter(str(a), "good"), Counter(str(b), "bad")
    s = HardwareSampler([good, bad], 0.001, capacity=4 * sampler_mod.BATCH)
    s.start()
    for n in range(1, 2 * sampler_mod.BATCH):              # the file's value moves while it is sampled
        os.pwrite(fa, b"%08d\n" % n, 0)
        os.pwrite(fb, b"%08d\n" % (n if n < sampler_mod.BATCH + 5 else -1), 0)
        seen = s.ticks
        until(lambda: s.ticks > seen, 10, f"a tick after value {n}", every=0.0005)   # each value sampled
    series = s.stop()
    os.close(fa)
    os.close(fb)
    got, twice = series.columns["good_n"], series.columns["good_twice"]
    assert len(got) > sampler_mod.BATCH + 5 and np.isfinite(got).all()
    assert np.all(np.diff(got) >= 0) and got[-1] == 2 * sampler_mod.BATCH - 1 and np.array_equal(twice, 2 * got)
    assert len(np.unique(got)) > 8                          # each tick its own bytes, not one batch's last
    assert [(g.source, "negative count -1" in g.reason) for g in series.gaps] == [("bad", True)]
    bad_n = series.columns["bad_n"]
    assert np.isfinite(bad_n[:5]).all() and not np.isfinite(bad_n[-1])   # read until it broke, NaN after


def test_a_proc_file_that_goes_away_mid_window_is_a_gap() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.15)"])
    try:
        gone = SchedStat(child.pid, child.pid)
        mine = SchedStat(os.getpid(), threading.get_native_id())
        mine.name = "mine"
        mine.columns = ("mine_cpu_ns", "mine_wait_ns")
        s = HardwareSampler([gone, mine], 0.002, capacity=500)
        s.start()
        child.wait()
        until(lambda: s.gaps, 10, "the gone process's gap")
        series = s.stop()
    finally:
        child.kill()
    assert [g.source for g in series.gaps] == ["schedstat"] and "read failed" in series.gaps[0].reason
    assert np.isfinite(series.columns["main_cpu_ns"][:3]).all() and np.isfinite(series.columns["mine_cpu_ns"]).all()


def test_a_duty_cycled_sampler_samples_in_bursts_at_random_pauses_and_stops_at_once_in_a_pause() -> None:
    from eroica.collector.proc_sources import NetDev

    s = HardwareSampler([NetDev(os.getpid(), interfaces=("lo",))], 0.001, 20_000, duty=0.25, burst=0.05)
    s.start()
    time.sleep(1.6)
    t0 = time.monotonic()
    series = s.stop()
    assert time.monotonic() - t0 < 0.05                 # a pause of up to 225 ms does not hold stop() up
    dt = np.diff(series.t_ns) / 1e9
    pauses = dt[dt > 0.07]          # 75-225 ms by design; a busy machine may delay a tick, not this long
    # ~25% of 1.6 s at 1 kHz; within a burst the samples are as fine as without the duty cycle
    assert 100 <= len(series.t_ns) <= 700, len(series.t_ns)
    assert np.median(dt) < 0.002
    assert len(pauses) >= 3 and pauses.max() <= 0.3, pauses
    assert len(np.unique(np.round(pauses, 3))) > 1     # not one fixed period: no aliasing with the step
    assert np.isfinite(series.columns["nic:lo"]).all()
