"""Offline ingestion of real multi-rank PyTorch profiler traces (../shared/traces/, read its
README) into pattern files, then the same diagnosis as live collection."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import eroica.collector.kineto as kineto
from eroica.cli.main import main
from eroica.engine.pipeline import DiagnoseOptions, diagnose

TRACES = Path(__file__).parents[3].parent / "shared" / "traces"
NEEDS = pytest.mark.skipif(not TRACES.is_dir(), reason=f"the shared traces are not at {TRACES}")
OPTS = DiagnoseOptions(in_process=True)


@NEEDS
def test_the_2_rank_recommendation_set_shows_rank_1s_embedding_kernels(tmp_path: Path) -> None:
    src = TRACES / "hta" / "trace_filter_sampled_2rank"
    assert main(["ingest", "kineto", str(src), "-o", str(tmp_path)]) == 0
    (w,) = diagnose(tmp_path, OPTS).windows
    assert (w.start_step, w.coverage.ranks_reported, w.coverage.world_size) == (551, [0, 1], 128)
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == ("workload_imbalance", [1])
    assert "split_embedding" in (top.function or "")
    # two ranks of 128 are a weak peer group: reported, with a clearly reduced confidence
    assert top.insufficient_peer_evidence and top.confidence < 0.2 and not w.findings[0].confidence >= 0.5
    assert "too few peers" in top.evidence[0]
    raw = sum(f.stat().st_size for f in src.iterdir() if f.name.endswith(".gz"))
    pat = sum(f.stat().st_size for f in (tmp_path / "w000-s551").iterdir())
    assert pat < raw / 5


@NEEDS
def test_the_8_rank_dlrm_set_is_ingested_and_diagnosed(tmp_path: Path) -> None:
    assert main(["ingest", "kineto", str(TRACES / "param" / "dlrm_kineto_8rank"), "-o", str(tmp_path)]) == 0
    (w,) = diagnose(tmp_path, OPTS).windows
    assert w.coverage.ranks_reported == list(range(8)) and w.start_step == 10
    doc = json.loads((tmp_path / "w000-s10" / "rank-1.json").read_text())
    cats = {f["category"] for f in doc["functions"]}
    assert {"kernel", "communication", "compute"} <= cats          # NCCL kernels found as communication
    assert any(f["name"].startswith("ncclKernel_SendRecv") for f in doc["functions"])
    assert not any(f.confidence >= 0.5 for f in w.findings)         # one step: leads at most, no verdict


@NEEDS
def test_ranks_whose_host_launches_late_are_one_host_launch_bound_finding(tmp_path: Path) -> None:
    """Generalization case 5, on a TRANSFORMED copy of the real 8-GPU trace (tests/kineto_transform.py):
    ranks 2 and 6 launch every kernel 40 us late, their devices idle, the others wait in NCCL."""
    from kineto_transform import delay_launches

    files = delay_launches(TRACES / "param" / "dlrm_kineto_8rank", tmp_path / "traces", [2, 6])
    assert all(f.name.endswith(".delayed-launches.json.gz") for f in files)
    assert main(["ingest", "kineto", str(tmp_path / "traces"), "-o", str(tmp_path / "run")]) == 0
    (w,) = diagnose(tmp_path / "run", OPTS).windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks, top.function) == ("host_launch_bound", [2, 6], "cudaLaunchKernel")
    assert top.confidence >= 0.5 and all(g.valid for g in w.peer_groups)
    assert not any(f.confidence >= 0.5 for f in w.findings[1:])
    # the untransformed trace: no rank is late for the others; nothing is named host_launch_bound
    assert main(["ingest", "kineto", str(TRACES / "param" / "dlrm_kineto_8rank"), "-o", str(tmp_path / "orig")]) == 0
    (w,) = diagnose(tmp_path / "orig", OPTS).windows
    assert not any(f.root_cause == "host_launch_bound" for f in w.findings)


@NEEDS
def test_rccl_and_the_older_flow_category_are_read(tmp_path: Path) -> None:
    f = TRACES / "tracelens" / "single_rank" / "mi300_resnet_act_checkpoint.json.gz"
    (doc,) = kineto.ingest_file(f)
    assert (doc.job.rank, doc.job.world_size, len(doc.step_times.during_seconds)) == (0, 8, 3)
    assert any(x.name.startswith("ncclDevKernel_Generic") and x.category.value == "communication"
               for x in doc.functions)


def _trace(events: list[dict], **meta: object) -> dict:
    return {"schemaVersion": 1, **meta, "traceEvents": events}


def _events(step_ms: float, kernel_ms: float) -> list[dict]:
    ev = []
    for i in range(3):
        t0 = i * step_ms * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 5}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": step_ms * 1000})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 10,
                   "dur": 5, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": "void gemm<float>(float*)", "pid": 0, "tid": 7,
                   "ts": t0 + 20, "dur": kernel_ms * 1000, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "pid": 0,
                   "tid": 8, "ts": t0 + 30 + kernel_ms * 1000, "dur": (step_ms - kernel_ms) * 500})
    return ev


def test_bad_files_get_a_clear_error_naming_them_and_the_others_are_ingested(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "traces"
    src.mkdir()
    for r in range(3):
        (src / f"good_rank{r}.json").write_text(json.dumps(_trace(_events(10, 4), distributedInfo={
            "rank": r, "world_size": 6})))
    (src / "anonymous.json").write_text(json.dumps(_trace(_events(10, 4))))          # no distributedInfo, no rank
    whole = json.dumps(_trace(_events(10, 4), distributedInfo={"rank": 4, "world_size": 6}))
    with gzip.open(src / "cut_rank4.json.gz", "wt") as fh:
        fh.write(whole[: len(whole) // 2])                                              # truncated
    (src / "settings.json").write_text(json.dumps({"lr": 0.1, "layers": [1, 2]}))     # not a trace
    assert main(["ingest", "kineto", str(src), "-o", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "anonymous.json: no distributedInfo and no rank in the file name" in out and "--rank" in out
    assert "cut_rank4.json.gz" in out and "truncated" in out
    assert "settings.json: not a Chrome trace: no traceEvents" in out
    assert "3 rank(s) ingested, 3 skipped" in out
    assert sorted(p.name for p in (tmp_path / "run" / "w000-s5").iterdir()) == [f"rank-{r}.json" for r in range(3)]
    # the rank of a file without distributedInfo can be given
    assert main(["ingest", "kineto", str(src / "anonymous.json"), "--rank", "anonymous.json=5",
                 "--world-size", "6", "-o", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "w000-s5" / "rank-5.json").exists()


def test_device_gaps_go_to_the_cpu_work_that_leaves_the_device_idle(tmp_path: Path) -> None:
    # the device idles after its kernels (2 ms gemm, 4 ms all-reduce) while the CPU runs an op: launch-bound
    ev = _events(10, 2)
    for i in range(3):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::slow_python_side", "pid": 1, "tid": 1,
                   "ts": i * 10000 + 6100, "dur": 3500})
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(_trace(ev)))
    (doc,) = kineto.ingest_file(p, world_size=1)
    f = {x.name: x for x in doc.functions}
    assert f["gemm"].category.value == "kernel"                     # template and arguments stripped
    cpu = f["aten::slow_python_side"]
    assert cpu.category.value == "compute" and 0.009 < cpu.critical_seconds < 0.012   # 3.5 ms x 3, device idle


def test_the_streaming_reader_matches_json_across_chunk_boundaries(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(kineto, "CHUNK", 7)                          # values split across many reads
    data = _trace(_events(10, 4), distributedInfo={"rank": 2, "world_size": 4}, deviceProperties=[{"name": "x"}])
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data, indent=1))
    meta, events = kineto.read_trace(p)
    assert list(events) == data["traceEvents"] and meta["distributedInfo"] == {"rank": 2, "world_size": 4}


def test_each_contiguous_range_of_profiled_steps_is_a_window(tmp_path: Path) -> None:
    ev = _events(10, 4)
    for e in _events(10, 4):
        e = dict(e, ts=e["ts"] + 1_000_000)
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 20}"
        ev.append(e)
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(_trace(ev, distributedInfo={"rank": 0, "world_size": 2})))
    docs = kineto.ingest_file(p)
    assert [(d.window.window_id, d.window.start_step, len(d.step_times.during_seconds)) for d in docs] == [
        ("w000-s5", 5, 3), ("w001-s25", 25, 3)]
    assert all(0.0099 < x < 0.0101 for d in docs for x in d.step_times.during_seconds)


@NEEDS
def test_the_fast_decoder_reads_what_the_stream_reads_on_every_shared_trace() -> None:
    for f in sorted(TRACES.rglob("*.json.gz")):
        fast = kineto._fast(f)
        meta, events = kineto.read_trace(f)
        slow = kineto._collect(events)
        assert fast is not None and fast[1] == slow, f
        assert {k: fast[0].get(k) for k in ("distributedInfo", "hostname")} == \
            {k: meta.get(k) for k in ("distributedInfo", "hostname")}, f


def test_events_of_unusual_types_fall_back_to_the_stream(tmp_path: Path) -> None:
    ev = _events(10, 3)
    ev[0] = {**ev[0], "ts": str(ev[0]["ts"])}                      # a string timestamp
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(_trace(ev)))
    assert kineto._fast(p) is None
    (doc,) = kineto.ingest_file(p, world_size=1)
    assert doc.step_times.during_seconds


@NEEDS
def test_diagnose_takes_traces_directly_and_keeps_the_patterns_where_asked(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    dlrm = TRACES / "param" / "dlrm_kineto_8rank"
    assert main(["ingest", "kineto", str(dlrm), "-o", str(tmp_path / "run")]) == 0
    assert main(["diagnose", str(tmp_path / "run")]) == 0
    two_steps = capsys.readouterr().out.split("next: eroica diagnose")[-1].split("\n", 1)[1]
    assert main(["diagnose", str(dlrm), "--patterns", str(tmp_path / "kept")]) == 0
    got = capsys.readouterr()
    assert got.out == two_steps and "8 trace file(s) ingested" in got.err
    assert len(list((tmp_path / "kept").glob("w*/rank-*.json"))) == 8
    assert main(["diagnose", str(tmp_path / "nothing-here.txt")]) == 2      # neither a run nor traces


@NEEDS
def test_the_ingest_workers_report_a_bad_file_and_keep_the_others(tmp_path: Path) -> None:
    files = sorted((TRACES / "param" / "dlrm_kineto_8rank").glob("*.json.gz"))[:3]
    bad = tmp_path / "rank9.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op"'))     # truncated
    job = kineto.IngestJob([files[0], bad, files[1], files[2]], workers=2)
    assert job.pool is not None                                      # enough bytes: forked workers
    out = list(job.results())
    assert [f for f, _ in out] == [files[0], bad, files[1], files[2]]
    assert isinstance(out[1][1], kineto.TraceError) and "rank9.json.gz" in str(out[1][1])
    assert all(isinstance(d, list) and d for i, (_, d) in enumerate(out) if i != 1)


def _collection_in_a_worker() -> tuple[bool, bool]:
    import gc

    kineto._worker_start()
    return gc.isenabled(), gc.get_freeze_count() > 0


def test_a_batch_command_collects_again_after_its_imports_and_so_do_its_ingest_workers() -> None:
    """`eroica diagnose` imports with cyclic collection held off; the command turns it back on for its
    work (`resume_collection`), and a worker forked meanwhile turns it on for its own work."""
    import gc
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from eroica.cli.fastpath import resume_collection

    gc.disable()
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            assert pool.submit(_collection_in_a_worker).result() == (True, True)
        assert not gc.isenabled()                    # the caller's own state is its own
        resume_collection()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        resume_collection()                                     # already on: nothing more is frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        gc.enable()


@NEEDS
def test_the_console_script_ends_fast_with_all_of_its_output(tmp_path: Path) -> None:
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "eroica"
    dlrm = TRACES / "param" / "dlrm_kineto_8rank"
    p = subprocess.run([str(exe), "diagnose", str(dlrm), "--format", "json"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["windows"]) == 1                  # flushed whole before os._exit


def test_diagnose_tells_traces_from_a_run_directory(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Profiler traces go through ingestion; a run, an incident or a window directory, and a pattern
    file, do not (their names say which: rank-N.json, host-*.jsonl, w*/, patterns/)."""
    src = tmp_path / "traces"
    src.mkdir()
    for r in range(4):
        (src / f"job_rank{r}.pt.trace.json").write_text(json.dumps(_trace(_events(10, 4), distributedInfo={
            "rank": r, "world_size": 4})))
    assert main(["diagnose", str(src), "--patterns", str(tmp_path / "run")]) == 0
    assert "4 trace file(s) ingested" in capsys.readouterr().err
    window = next((tmp_path / "run").glob("w*"))
    for p in (tmp_path / "run", window, window / "rank-2.json"):
        assert main(["diagnose", str(p)]) == 0
        assert "ingested" not in capsys.readouterr().err
