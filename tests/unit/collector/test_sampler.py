"""Real /proc readings, through the same out-of-process helper the Monitor uses."""

import os
import threading
import time

import numpy as np

from eroica.collector.facts import CollectorGap
from eroica.collector.sampler import HardwareSampler, SchedStat, default_sources
from eroica.collector.sampler_proc import SamplerClient
from eroica.collector.summarize import hardware_summary


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
    time.sleep(0.05)
    series = s.stop()
    assert [g.source for g in series.gaps] == ["broken"]
    assert np.isfinite(series.columns["main_cpu_ns"]).sum() >= 5


def test_sampler_memory_is_capped() -> None:
    s = HardwareSampler([SchedStat(os.getpid(), threading.get_native_id())], 0.0005, capacity=20)
    s.start()
    time.sleep(0.1)
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
