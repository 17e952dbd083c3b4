import numpy as np
from patterns_factory import make_doc

from eroica.engine.columns import window_columns
from eroica.engine.facts import HardwareSignal, HostCpuLoad, JobSlowdown
from eroica.engine.signals import SignalTable, host_cpu_facts, outlier_facts


def loaded(rank: int, proc: float, rq: float, sys_util: float = 0.99, step: float = 0.15):  # type: ignore[no-untyped-def]
    d = make_doc(rank, step=step)
    hw = d.hardware.model_copy(update={"process_cpu_cores": proc, "system_cpu_util_ratio": sys_util,
                                       "per_core_util_ratio": [sys_util, sys_util], "runqueue_wait_ratio": rq})
    return d.model_copy(update={"hardware": hw})


def test_host_load_splits_the_job_from_other_processes() -> None:
    docs = {r: loaded(r, 0.25, 0.2) for r in range(4)}
    (f,) = host_cpu_facts(SignalTable(window_columns(docs.values())), 2)
    assert isinstance(f, HostCpuLoad) and f.cores_total == 2 and f.ranks_on_host == 2   # make_doc: 2 ranks/host
    assert abs(f.busy_cores - 1.98) < 1e-6 and abs(f.job_cores - 0.5) < 1e-6 and abs(f.other_cores - 1.48) < 1e-6
    # without the process CPU of every rank on the host the split is unknown: no fact
    docs[3] = docs[3].model_copy(update={"hardware": docs[3].hardware.model_copy(update={"process_cpu_cores": None})})
    assert host_cpu_facts(SignalTable(window_columns(docs.values())), 2) == []


def test_the_rank_waiting_for_a_cpu_most_carries_the_jobs_slowdown() -> None:
    docs = {r: loaded(r, 0.25, 0.6 if r == 2 else 0.2 + 0.02 * r) for r in range(4)}
    keep = np.ones(6, dtype=bool)
    facts = outlier_facts(SignalTable(window_columns(docs.values())), [0, 1, 2, 3], keep, set(), 0.15)
    job = next(f for f in facts if isinstance(f, JobSlowdown))
    assert job.rank == 2 and abs(job.step_ratio_to_baseline - 2.5) < 1e-6 and job.ranks_standing_out == 0
    rq = next(f for f in facts if isinstance(f, HardwareSignal) and f.signal == "runqueue_wait_ratio")
    assert rq.rank == 2 and abs(rq.delta - 0.38) < 1e-6
    assert any(isinstance(f, HostCpuLoad) for f in facts)
    # a suspect rank already has its signals: only the slowdown is added
    table = SignalTable(window_columns(docs.values()))
    assert [type(f) for f in outlier_facts(table, [0, 1, 2, 3], keep, {2}, 0.15)] == [JobSlowdown]
    # nobody waits much more than the others: nothing
    even = {r: loaded(r, 0.25, 0.3 + 0.01 * r) for r in range(4)}
    assert outlier_facts(SignalTable(window_columns(even.values())), [0, 1, 2, 3], keep, set(), 0.15) == []


def test_a_left_out_step_is_left_out_of_the_signals() -> None:
    d = loaded(0, 0.25, 0.1)
    hw = d.hardware.model_copy(update={"per_step": {"runqueue_wait_ratio": [0.4, 0.4, 0.0, 0.4, 0.4, 0.4]}})
    d = d.model_copy(update={"hardware": hw, "step_times": d.step_times.model_copy(
        update={"during_seconds": [0.1, 0.1, 5.0, 0.1, 0.1, 0.1]})})
    keep = np.array([True, True, False, True, True, True])
    table = SignalTable(window_columns([d]))
    assert abs(table.value("runqueue_wait_ratio", 0, keep) - 0.4) < 1e-9
    assert table.value("runqueue_wait_ratio", 0) == 0.1                       # the whole window
    assert table.value("io_wait_ratio", 0, keep) is None                      # not sampled at all


def test_a_gpu_with_links_down_is_named_though_no_rank_is_late(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from patterns_factory import write_run

    from eroica.engine.pipeline import DiagnoseOptions, diagnose

    docs = []
    for r in range(4):
        d = make_doc(r, step=0.1)            # every rank alike, 1.67x its 60 ms baseline
        gpu = {"gpu_nvlink_links_active": 12.0 if r == 1 else 18.0, "gpu_nvlink_errors_per_second": 0.0}
        docs.append(d.model_copy(update={"hardware": d.hardware.model_copy(update={"gpu": gpu})}))
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    top = w.findings[0]
    assert (top.root_cause, top.ranks, top.confidence >= 0.5) == ("nvlink_degraded", [1], True)
    assert "12 NVLink links up against 18" in top.summary
    assert [f.ranks for f in w.findings] == [[1]]


def _loader(rank: int, busy: float, reads: float = 0.0, rq: float = 0.01, step: float = 0.15):  # type: ignore[no-untyped-def]
    d = make_doc(rank, step=step)
    hw = d.hardware.model_copy(update={
        "loader_workers_total": 2, "loader_worker_busy_ratio": busy, "loader_worker_cpu_ratio": 0.05,
        "loader_worker_io_wait_ratio": 0.0, "loader_worker_runqueue_wait_ratio": rq,
        "loader_worker_major_faults_per_second": 1.0, "loader_worker_disk_read_bytes_per_second": reads,
        "cgroup_memory_usage_ratio": 0.3, "cgroup_memory_limit_hits_per_second": 0.0})
    return d.model_copy(update={"hardware": hw})


def test_a_rank_whose_loader_workers_have_no_headroom_is_stated_though_it_is_not_late() -> None:
    keep = np.ones(6, dtype=bool)
    docs = {r: _loader(r, 0.95 if r == 3 else 0.1 + 0.02 * r) for r in range(4)}
    facts = outlier_facts(SignalTable(window_columns(docs.values())), [0, 1, 2, 3], keep, set(), 0.15)
    assert {f.rank for f in facts} == {3}
    busy = next(f for f in facts if isinstance(f, HardwareSignal) and f.signal == "loader_worker_busy_ratio")
    assert busy.value == 0.95 and abs(busy.peer_median - 0.12) < 1e-6
    assert any(isinstance(f, JobSlowdown) for f in facts)
    # busy well above the peers but with headroom left (under 0.8): not stated
    docs[3] = _loader(3, 0.75)
    assert outlier_facts(SignalTable(window_columns(docs.values())), [0, 1, 2, 3], keep, set(), 0.15) == []
    # a rank whose workers read from disk far more than its peers' is stated too
    docs = {r: _loader(r, 0.3, reads=1.2e8 if r == 1 else 0.0) for r in range(4)}
    facts = outlier_facts(SignalTable(window_columns(docs.values())), [0, 1, 2, 3], keep, set(), 0.15)
    assert {f.rank for f in facts} == {1}


def test_a_saturated_loader_is_the_stall_once_its_rank_waits_and_listed_for_reference_while_hidden(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from patterns_factory import write_run

    from eroica.engine.pipeline import DiagnoseOptions, diagnose

    # prefetching hides it: rank 2 is not late, so the finding carries no cost and stays below 0.5
    docs = [_loader(r, 0.97 if r == 2 else 0.1, step=0.12) for r in range(4)]
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    (f,) = [f for f in w.findings if f.root_cause == "dataloader_stall"]
    assert f.ranks == [2] and 0.3 <= f.confidence < 0.5
    assert "loader workers are busy 97%" in f.summary
    # rank 2 waits for its batches: it is late, and the stall is the verdict
    late = make_doc(2, step=0.12, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                        "data:DataLoader.__next__": 0.04})
    docs[2] = late.model_copy(update={"hardware": docs[2].hardware})
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    found = [(f.root_cause, f.ranks) for f in w.findings if f.confidence >= 0.5]
    assert found == [("dataloader_stall", [2])], [(f.root_cause, f.ranks, f.confidence) for f in w.findings]
    (f,) = [f for f in w.findings if f.root_cause == "dataloader_stall"]
    assert any("loader_worker_busy_ratio" in line for line in f.evidence), f.evidence


def test_workers_reading_back_what_a_full_memory_cgroup_dropped_are_memory_pressure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from patterns_factory import write_run

    from eroica.engine.pipeline import DiagnoseOptions, diagnose

    docs = []
    for r in range(4):
        d = _loader(r, 0.3, reads=1.2e8 if r == 1 else 0.0, step=0.12)
        if r == 1:      # it waits for its batches: late
            late = make_doc(1, step=0.12, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                                "data:DataLoader.__next__": 0.04})
            d = late.model_copy(update={"hardware": d.hardware.model_copy(update={
                "cgroup_memory_usage_ratio": 0.98, "cgroup_memory_limit_hits_per_second": 3000.0})})
        docs.append(d)
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    found = [(f.root_cause, f.ranks) for f in w.findings if f.confidence >= 0.5]
    assert found == [("host_memory_pressure", [1])], [(f.root_cause, f.ranks, f.confidence) for f in w.findings]
    # without the limit hits (a first pass over cold data), the reads alone name no memory problem
    docs[1] = docs[1].model_copy(update={"hardware": docs[1].hardware.model_copy(update={
        "cgroup_memory_usage_ratio": 0.5, "cgroup_memory_limit_hits_per_second": 0.0})})
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    assert not [f for f in w.findings if f.root_cause == "host_memory_pressure"]
