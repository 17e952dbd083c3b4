"""Clock independence: a rank's clock shifted by up to +-50 ms, or running fast or slow, changes no
finding. Patterns carry durations only; where timestamps exist (the live collector's executions,
samples and step bounds; ingested Kineto traces) each rank is read on its own clock."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eroica.collector.critical import Execution
from eroica.collector.kineto import write_doc
from eroica.collector.sampler import SampleSeries
from eroica.collector.summarize import WindowRecord, summarize
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.schema.patterns import Category as C
from eroica.schema.patterns import JobInfo

MS = 1_000_000
STEPS = 8
OPTS = DiagnoseOptions(in_process=True)
SHIFT = st.integers(-50 * MS, 50 * MS)
SKEW = st.floats(-1e-4, 1e-4)            # 100 ppm, far beyond an NTP-disciplined clock


def record(rank: int, offset_ns: int = 0, skew: float = 0.0) -> WindowRecord:
    """One rank's window as the collector captures it; rank 2's loader stalls 60 ms each step."""
    def t(ns: float) -> int:
        return int(round(1_000_000_000_000 + offset_ns + ns * (1 + skew)))

    step = 150 * MS
    execs, bounds = [], [t(0)]
    for s in range(STEPS):
        t0 = s * step
        load = 62 * MS if rank == 2 else 2 * MS
        execs += [Execution(t(t0), t(t0 + load), C.data, "DataLoader.__next__"),
                  Execution(t(t0 + load), t(t0 + load + 50 * MS), C.compute, "DistributedDataParallel.forward"),
                  Execution(t(t0 + load + 50 * MS), t(t0 + step), C.communication, "gloo:all_reduce")]
        bounds.append(t(t0 + step))
    ts = np.array([t(k * 10 * MS) for k in range(STEPS * 15 + 1)])
    cpu = np.cumsum(np.full(len(ts), 6 * MS)).astype(float)
    series = SampleSeries(t_ns=ts, columns={"main_cpu_ns": cpu}, gaps=[], interval_seconds=0.01,
                          sampler_cpu_seconds=0.0, dropped_total=0)
    return WindowRecord(job=JobInfo(rank=rank, world_size=4, hostname=f"h{rank}", pid=10 + rank),
                        window_id="w000-s30", start_step=30, trigger="detector", triggered_by_rank=0,
                        step_bounds_ns=bounds, before_seconds=[0.1] * 10, baseline_median_seconds=0.1,
                        executions=execs, samples=series)


def findings(shifts: list[tuple[int, float]]) -> list[tuple[str, list[int], str | None, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        for r, (off, skew) in enumerate(shifts):
            write_doc(Path(tmp), summarize(record(r, off, skew), 0.0, 0.0))
        (w,) = diagnose(Path(tmp), OPTS).windows
    return [(f.root_cause, f.ranks, f.function, f.confidence) for f in w.findings]


def test_a_rank_summarizes_the_same_on_a_shifted_clock() -> None:
    plain = summarize(record(1), 0.0, 0.0)
    shifted = summarize(record(1, offset_ns=-37 * MS), 0.0, 0.0)
    assert plain == shifted


@given(st.lists(st.tuples(SHIFT, SKEW), min_size=4, max_size=4))
def test_clock_offsets_and_rates_per_rank_change_no_finding(shifts: list[tuple[int, float]]) -> None:
    base = findings([(0, 0.0)] * 4)
    got = findings(shifts)
    assert [f[:3] for f in got] == [f[:3] for f in base] and base[0][:2] == ("dataloader_stall", [2])
    assert all(abs(a[3] - b[3]) < 0.01 for a, b in zip(got, base))


TRACES = Path(__file__).parents[3].parent / "shared" / "traces" / "hta" / "trace_filter_sampled_2rank"


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"the shared traces are not at {TRACES}")
def test_ingested_traces_diagnose_alike_with_each_ranks_clock_shifted(tmp_path: Path) -> None:
    from eroica.cli.main import main

    def ingest(out: Path, shift_us: dict[int, float]) -> list[tuple[str, list[int], str | None]]:
        src = out / "traces"
        src.mkdir(parents=True)
        for i, f in enumerate(sorted(TRACES.glob("*.json.gz"))):
            data = json.loads(gzip.open(f).read())
            for ev in data.get("traceEvents", []):
                if "ts" in ev:
                    ev["ts"] = ev["ts"] + shift_us.get(i, 0.0)
            (src / f.name).write_bytes(gzip.compress(json.dumps(data).encode()))
        assert main(["ingest", "kineto", str(src), "-o", str(out / "run")]) == 0
        (w,) = diagnose(out / "run", OPTS).windows
        return [(f.root_cause, f.ranks, f.function) for f in w.findings]

    assert ingest(tmp_path / "a", {}) == ingest(tmp_path / "b", {0: -50_000.0, 1: 41_000.0})
