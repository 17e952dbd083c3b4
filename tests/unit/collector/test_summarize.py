import json

import numpy as np

from eroica.collector.critical import Execution
from eroica.collector.sampler import SampleSeries
from eroica.collector.summarize import WindowRecord, summarize
from eroica.schema.patterns import Category as C
from eroica.schema.patterns import CollectorGap, JobInfo, MetricName, PatternsDoc

MS = 1_000_000


def record(execs: list[Execution], series: SampleSeries | None = None) -> WindowRecord:
    return WindowRecord(
        job=JobInfo(rank=3, world_size=4, hostname="h", pid=1), window_id="w000-s10", start_step=10,
        trigger="detector", triggered_by_rank=0, step_bounds_ns=[0, 100 * MS, 200 * MS],
        before_seconds=[0.09] * 5, baseline_median_seconds=0.09, executions=execs, samples=series,
        gaps=[CollectorGap(source="nvml", reason="no GPU")],
    )


def test_beta_duration_stats_and_per_step_values() -> None:
    execs = [Execution(0, 60 * MS, C.data, "DataLoader.__next__"),
             Execution(60 * MS, 90 * MS, C.compute, "fwd"),
             Execution(100 * MS, 110 * MS, C.data, "DataLoader.__next__"),
             Execution(110 * MS, 200 * MS, C.compute, "fwd"),
             Execution(0, 1 * MS // 10, C.compute, "tiny")]       # 0.05% of the window: dropped
    doc = summarize(record(execs), 0.0, 0.01)
    f = {x.name: x for x in doc.functions}
    assert set(f) == {"DataLoader.__next__", "fwd", "untracked"}
    load = f["DataLoader.__next__"]
    assert load.category == C.data and load.occurrences_total == 2
    assert abs(load.beta_ratio - 0.35) < 1e-6 and load.critical_per_step_seconds == [0.06, 0.01]
    assert load.max_seconds == 0.06 and abs(load.mean_seconds - 0.035) < 1e-9
    assert f["untracked"].critical_per_step_seconds == [0.01, 0.0]
    assert doc.window.end_step == 12 and doc.step_times.during_seconds == [0.1, 0.1]
    assert doc.gaps[0].source == "nvml"


def test_metric_mu_sigma_come_from_samples_during_the_function() -> None:
    t = np.arange(0, 201, 10) * MS
    cpu_ns = np.concatenate([np.zeros(7), np.cumsum(np.full(14, 10 * MS))])  # idle 0-60 ms, busy afterwards
    series = SampleSeries(t_ns=t, columns={"main_cpu_ns": cpu_ns}, gaps=[], interval_seconds=0.01,
                          sampler_cpu_seconds=0.001, dropped_total=0)
    execs = [Execution(0, 60 * MS, C.data, "load"), Execution(60 * MS, 200 * MS, C.compute, "fwd")]
    doc = summarize(record(execs, series), 0.0, 0.01)
    f = {x.name: x for x in doc.functions}
    assert f["load"].metric == MetricName.cpu_util_ratio and f["load"].metric_mean < 0.2
    assert f["fwd"].metric_mean > 0.9 and f["fwd"].metric_std < 0.3
    assert doc.hardware.samples_total == 21 and 0.6 < doc.hardware.cpu_util_ratio < 0.75


def test_the_document_is_small_and_round_trips() -> None:
    execs = [Execution(i * MS, i * MS + MS // 2, C.compute, f"op{i % 30}") for i in range(200)]
    doc = summarize(record(execs), 0.0, 0.01)
    text = json.dumps(doc.model_dump(mode="json", by_alias=True))
    assert len(text) < 16_000
    assert PatternsDoc.model_validate(json.loads(text)) == doc


def test_hardware_signals_are_kept_per_step_too() -> None:
    # step 1 (0-100 ms): the thread sits in D state; step 2 (100-200 ms): it computes
    t = np.arange(0, 201, 10) * MS
    in_io = np.where(t < 100 * MS, 1.0, 0.0)
    cpu_ns = np.concatenate([np.zeros(11), np.cumsum(np.full(10, 10 * MS))])
    series = SampleSeries(t_ns=t, columns={"main_in_io": in_io, "main_cpu_ns": cpu_ns}, gaps=[],
                          interval_seconds=0.01, sampler_cpu_seconds=0.001, dropped_total=0)
    doc = summarize(record([Execution(0, 200 * MS, C.compute, "fwd")], series), 0.0, 0.01)
    per = doc.hardware.per_step
    assert set(per) == {"io_wait_ratio", "cpu_util_ratio"}           # only signals that were sampled
    io, cpu = per["io_wait_ratio"], per["cpu_util_ratio"]
    assert len(io) == len(cpu) == 2
    assert io[0] > 0.9 and io[1] < 0.2 and cpu[0] < 0.1 and cpu[1] > 0.8
    assert 0.4 < doc.hardware.io_wait_ratio < 0.6                   # the whole window mixes both
    assert summarize(record([Execution(0, 200 * MS, C.compute, "fwd")]), 0.0, 0.01).hardware.per_step == {}


def test_percentiles_are_numpys_linear_percentiles_to_the_bit() -> None:
    from eroica.collector.summarize import percentiles

    rng = np.random.default_rng(0)
    qs = (0, 10, 50, 90, 99, 100)
    for trial in range(3000):
        n = int(rng.integers(1, 60))
        x = (rng.lognormal(-6, 2, n), rng.integers(0, 5, n) * 1e-3, rng.random(n))[trial % 3]
        assert percentiles(x, *qs) == tuple(float(np.percentile(x, q)) for q in qs), trial


def test_the_pause_between_two_fast_nic_bursts_is_not_a_sample_of_the_link() -> None:
    # bursts of 1 ms samples at a steady 1 GB/s (a capped link), 70 ms apart: a rate taken over a
    # pause would be a smooth extra sample; it is left out, so the signature keeps its spread
    t, b, now, tot = [], [], 0, 0.0
    for burst in range(4):
        for _ in range(20):
            t.append(now)
            b.append(tot)
            now += MS
            tot += 1e6 * (1.0 if burst % 2 else 3.0)   # 1 or 3 GB/s in alternate bursts
        now += 30 * MS
        tot += 0.0                                      # nothing sent in the pause
    series = SampleSeries(t_ns=np.array([0, 200 * MS]), columns={}, gaps=[], interval_seconds=0.02,
                          sampler_cpu_seconds=0.0, dropped_total=0,
                          extras={"nic_fast_t_ns": np.array(t), "nic_fast_bytes": np.array(b),
                                  "nic_fast_interval_seconds": 0.001})
    doc = summarize(record([Execution(0, 200 * MS, C.communication, "gloo:all_reduce")], series), 0.0, 0.01)
    (f,) = [x for x in doc.functions if x.name == "gloo:all_reduce"]
    assert f.metric == MetricName.nic_bytes_per_second
    assert f.metric_samples_total == 4 * 19                 # the three pauses are no samples
    assert abs(f.metric_mean - 2e9) < 1e7 and abs(f.metric_std - 1e9) < 1e7
