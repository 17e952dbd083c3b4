"""Hard caps, driven past: the window's event buffer (count, and bytes through the name cap), the
sampler's ring, the raw-trace escape hatch, and the pattern writer's queue."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eroica.collector import Monitor, TriggerPolicy
from eroica.collector.proc_sources import SchedStat
from eroica.collector.sampler import HardwareSampler
from eroica.collector.writer import PatternWriter
from eroica.schema.patterns import PatternsDoc

torch = pytest.importorskip("torch")


def loop(mon: Monitor, steps: int, regions_per_step: int, name: str = "r") -> None:
    model = torch.nn.Linear(16, 16)
    for _ in range(steps):
        for k in range(regions_per_step):
            with mon.region(f"{name}{k % 3}"):
                pass
        model(torch.randn(4, 16)).sum().backward()
        mon.step()


def test_the_event_buffer_stops_at_its_count_and_long_names_are_cut(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", "2")
    mon = Monitor(out_dir=tmp_path, policy=TriggerPolicy(window_steps=4, max_events=1000))
    loop(mon, 8, regions_per_step=600, name="x" * 10_000)    # 2,400 region executions in the window
    mon.close()
    doc = PatternsDoc.model_validate_json((tmp_path / "w000-s2" / "rank-0.json").read_text())
    assert doc.overhead.raw_events_dropped_total >= 2400 - 1000
    assert all(len(f.name) <= 200 for f in doc.functions)
    assert doc.overhead.pattern_bytes < 20_000


def test_the_sampler_ring_keeps_its_capacity_and_counts_what_it_dropped() -> None:
    import os

    s = HardwareSampler([SchedStat(os.getpid(), threading.get_native_id())], 0.001, capacity=25)
    s.start()
    deadline = time.monotonic() + 10               # until the ring has overflowed well past its capacity
    while s._dropped <= 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    series = s.stop()
    assert len(series.t_ns) == 25 and series.dropped_total > 50
    assert all(len(v) == 25 for v in series.columns.values())


def test_a_raw_trace_over_its_cap_is_removed_and_said(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_FORCE_WINDOW_AT_STEP", "2")
    pol = TriggerPolicy(window_steps=3, keep_raw_trace=True, raw_trace_max_bytes=100)
    mon = Monitor(out_dir=tmp_path, policy=pol)
    loop(mon, 7, regions_per_step=1)
    mon.close()
    doc = PatternsDoc.model_validate_json((tmp_path / "w000-s2" / "rank-0.json").read_text())
    assert not list(tmp_path.glob("w000-s2/*.trace.json")) and doc.overhead.raw_trace_bytes == 0
    assert any(g.source == "raw_trace" and "over cap" in g.reason for g in doc.gaps)


def test_the_pattern_writer_holds_a_bounded_queue_when_the_disk_hangs(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    release, writing = threading.Event(), threading.Event()
    plain = Path.write_text

    def hung(self: Path, *a, **k):  # type: ignore[no-untyped-def]
        writing.set()
        release.wait(10)
        return plain(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", hung)
    w = PatternWriter(max_pending=2)
    assert w.submit(tmp_path / "a.json", "1")
    assert writing.wait(5)                         # the thread took it and hangs in the write
    assert w.submit(tmp_path / "b.json", "2") and w.submit(tmp_path / "c.json", "3")
    assert not w.submit(tmp_path / "d.json", "4")  # full: dropped, not held, never blocking
    assert not w.flush(0.1)
    release.set()
    assert w.close(5) and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "c.json"]
