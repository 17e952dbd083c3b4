import json
from pathlib import Path

import pytest
from patterns_factory import make_doc, write_run

from eroica.engine.errors import RunDirError
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.reports import render


def slow_docs(rank: int = 2, n: int = 4, **kw):  # type: ignore[no-untyped-def]
    docs = [make_doc(r, world=n, step=0.16, **kw) for r in range(n)]
    docs[rank] = make_doc(rank, world=n, step=0.16, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                                          "data:DataLoader.__next__": 0.1}, **kw)
    return docs


def test_dataloader_stall_is_the_top_finding(tmp_path: Path) -> None:
    d = diagnose(write_run(tmp_path, slow_docs()), DiagnoseOptions(in_process=True))
    [w] = d.windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks, top.function) == ("dataloader_stall", [2], "DataLoader.__next__")
    assert top.confidence >= 0.8 and top.category.value == "software"
    assert top.hosts == ["host1"] and not w.healthy
    assert top.confidence_factors.peer_group_valid


def test_healthy_run_reports_nothing(tmp_path: Path, healthy_docs) -> None:  # type: ignore[no-untyped-def]
    d = diagnose(write_run(tmp_path, healthy_docs))
    assert d.windows[0].findings == [] and d.windows[0].healthy
    assert "healthy" in render(d, "text")


def test_throttled_rank_is_hardware(tmp_path: Path) -> None:
    docs = [make_doc(r, step=0.2) for r in range(4)]
    docs[1] = make_doc(1, step=0.2, busy={"compute:forward": 0.08, "compute:backward": 0.1}, throttled=0.6,
                       cpu_metric=0.2)
    top = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0].findings[0]
    assert (top.root_cause, top.ranks, top.category.value) == ("cpu_throttled", [1], "hardware")


def test_small_peer_group_lowers_confidence_and_says_why(tmp_path: Path) -> None:
    big = diagnose(write_run(tmp_path / "a", slow_docs(2, 4)), DiagnoseOptions(in_process=True))
    small = diagnose(write_run(tmp_path / "b", slow_docs(1, 2)), DiagnoseOptions(in_process=True))
    fb, fs = big.windows[0].findings[0], small.windows[0].findings[0]
    assert fs.root_cause == "dataloader_stall" and fs.confidence < fb.confidence
    assert fs.insufficient_peer_evidence and "too few peers" in fs.evidence[0]


def test_missing_ranks_lower_coverage_and_confidence(tmp_path: Path) -> None:
    docs = slow_docs(2, 5)
    del docs[4]
    w = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0]
    assert w.coverage.ranks_missing == [4] and w.coverage.coverage_ratio == 0.8
    assert w.findings[0].confidence_factors.coverage_ratio == 0.9       # 0.5 + 0.5 x 0.8: halved at most


def test_a_broken_file_is_named_and_the_rest_is_diagnosed(tmp_path: Path) -> None:
    run = write_run(tmp_path, slow_docs())
    (run / "w000-s30" / "rank-3.json").write_text('{"schema": "eroica.patterns/v1", "job": ')
    (run / "w000-s30" / "rank-0.json").write_text(json.dumps({"schema": "eroica.patterns/v0"}))
    w = diagnose(run, DiagnoseOptions(in_process=True)).windows[0]
    probs = " ".join(w.coverage.file_problems)
    assert "rank-3.json" in probs and "not valid JSON" in probs
    assert "rank-0.json" in probs and "schema" in probs
    assert w.coverage.ranks_reported == [1, 2]
    assert w.findings == [] or w.findings[0].insufficient_peer_evidence


def test_not_a_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="nope: no such file or directory"):
        diagnose(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        diagnose(tmp_path / "file.txt")


@pytest.mark.parametrize("fmt", ["text", "md", "json"])
def test_every_format_renders(tmp_path: Path, fmt: str) -> None:
    out = render(diagnose(write_run(tmp_path, slow_docs()), DiagnoseOptions(in_process=True)), fmt)
    assert "dataloader_stall" in out
    if fmt == "json":
        data = json.loads(out)
        assert data["schema"] == "eroica.diagnosis/v1"
        assert data["windows"][0]["findings"][0]["ranks"] == [2]


def test_a_throttled_gpu_is_named_from_replayed_nvml_signals(tmp_path: Path) -> None:
    docs = []
    for r in range(8):
        slow = r == 5
        d = make_doc(r, world=8, step=0.3, busy={"kernel:sm90_xmma_gemm": 0.2 if slow else 0.12,
                                                 "compute:forward": 0.01})
        gpu = {"gpu_sm_clock_mhz": 1410.0 if slow else 1980.0, "gpu_throttled_sample_ratio": 0.8 if slow else 0.0,
               "gpu_pcie_width": 16.0}
        docs.append(d.model_copy(update={"hardware": d.hardware.model_copy(update={"gpu": gpu})}))
    top = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows[0].findings[0]
    assert (top.root_cause, top.ranks, top.category.value) == ("gpu_throttled", [5], "hardware")
    assert top.function == "sm90_xmma_gemm"


def test_without_peers_the_expected_range_rules_judge_the_step_and_say_so(tmp_path: Path) -> None:
    # a one-rank job: nobody to compare with; its step is 60% data loading
    doc = make_doc(0, world=1, step=0.16, busy={"compute:forward": 0.03, "data:DataLoader.__next__": 0.1})
    [w] = diagnose(write_run(tmp_path, [doc]), DiagnoseOptions(in_process=True)).windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks, top.rule_ids) == ("dataloader_stall", [0], ["range.data-share"])
    # strong single-rank evidence reaches a confident finding: the rule judges the step against the expected
    # range, so the missing peer group does not weaken it (its own prior, 0.6, bounds it instead)
    f = top.confidence_factors
    assert top.insufficient_peer_evidence and f.peer_group_ratio == 1.0 and top.confidence >= 0.5
    assert "judged against the expected range" in f.peer_group
    assert top.confidence == round(f.rule_ratio * f.deviation_strength_ratio * f.step_consistency_ratio
                                   * f.coverage_ratio, 4)
    assert "judged against the expected range only" in top.summary
    assert top.evidence[0].startswith("insufficient peer evidence: only 1 rank")
    # a share inside the expected range states nothing confident
    mild = make_doc(0, world=1, step=0.16, busy={"compute:forward": 0.1, "data:DataLoader.__next__": 0.02})
    found = diagnose(write_run(tmp_path / "mild", [mild]), DiagnoseOptions(in_process=True)).windows[0].findings
    assert all(x.confidence < 0.5 for x in found)
    # a healthy one-rank step states nothing
    ok = make_doc(0, world=1, step=0.16)
    assert diagnose(write_run(tmp_path / "ok", [ok]), DiagnoseOptions(in_process=True)).windows[0].findings == []


def test_a_cause_that_recurs_across_windows_keeps_its_confidence_and_a_one_off_loses_some(tmp_path: Path) -> None:
    from patterns_factory import make_doc as mk

    for wid in ("w000-s30", "w001-s60", "w002-s90"):
        docs = [mk(r, step=0.16, window=wid) for r in range(4)]
        docs[2] = mk(2, step=0.16, window=wid, busy={"compute:forward": 0.02, "data:DataLoader.__next__": 0.1})
        if wid == "w001-s60":   # a GC pause on rank 0 in one window only
            docs[0] = mk(0, step=0.16, window=wid, busy={"compute:forward": 0.02, "gc:gc.collect(gen2)": 0.1})
        write_run(tmp_path, docs)
    d = diagnose(tmp_path, DiagnoseOptions(in_process=True))
    stall = [f for w in d.windows for f in w.findings if f.root_cause == "dataloader_stall"]
    assert len(stall) == 3 and all(f.confidence_factors.windows_seen_total == 3 for f in stall)
    assert all(f.confidence_factors.window_consistency_ratio == 1.0 for f in stall)
    (gc,) = [f for w in d.windows for f in w.findings if f.root_cause == "gc_pause"]
    # counted from its first window (the second): the first saw the job before it, not a pause that failed to recur
    assert (gc.confidence_factors.windows_seen_total, gc.confidence_factors.windows_total) == (1, 2)
    assert gc.confidence_factors.window_consistency_ratio == round(0.8 + 0.2 / 2, 4)


def test_a_loader_wait_is_judged_by_its_own_share_of_the_step_not_by_the_whole_ranks(tmp_path: Path) -> None:
    # rank 2 is 9% of a step late: 4 ms more compute and 5 ms more loader wait than its peers. The loader
    # holds more than half of the excess, so the rules call it a stall; its deviation is its own 5% of
    # a step (the noise floor of a straggler), not the rank's 9%, so it stays below a confident finding
    peer = {"compute:forward": 0.02, "compute:backward": 0.03, "data:DataLoader.__next__": 0.001}
    docs = [make_doc(r, step=0.1, busy=peer) for r in range(4)]
    docs[2] = make_doc(2, step=0.1, busy={**peer, "compute:forward": 0.024, "data:DataLoader.__next__": 0.006})
    [w] = diagnose(write_run(tmp_path, docs), DiagnoseOptions(in_process=True)).windows
    [stall] = [f for f in w.findings if f.root_cause == "dataloader_stall"]
    assert stall.ranks == [2] and stall.confidence_factors.deviation_strength_ratio == 0.5
    assert stall.confidence < 0.5, stall
    # a loader wait that holds the whole excess (15% of a step): the stall's deviation is the rank's
    docs[2] = make_doc(2, step=0.1, busy={**peer, "data:DataLoader.__next__": 0.016})
    [w] = diagnose(write_run(tmp_path / "whole", docs), DiagnoseOptions(in_process=True)).windows
    top = w.findings[0]
    assert top.root_cause == "dataloader_stall" and top.confidence_factors.deviation_strength_ratio == 0.75


def test_a_finding_stands_on_its_strongest_argument_not_on_the_surest_rule() -> None:
    # INC-0052: six busy processes in rank 2's container and four ranks on two cores spread the healthy
    # peers' measured compute work (1.0x, 1.45x, 1.69x), so the group is no group of equals. The
    # peer-based contention rule (prior 0.99) is halved by that; the container rule needs no peers
    # (foreign processes' cores in the rank's container, the job against its own baseline)
    run = Path(__file__).resolve().parents[3] / "incidents" / "INC-0052" / "patterns"
    [w] = diagnose(run, DiagnoseOptions(in_process=True)).windows
    [top] = w.findings
    f = top.confidence_factors
    assert (top.root_cause, top.ranks) == ("cpu_contention", [2])
    assert {"cpu.contention", "cpu.contention-container"} <= set(top.rule_ids)
    assert f.prior_rule_id == "cpu.contention-container" and f.peer_group_ratio == 1.0
    assert not f.peer_group_valid and top.insufficient_peer_evidence
    assert top.confidence >= 0.9
    # the halved rule's own measurements still follow the one the confidence rests on
    busy = next(i for i, e in enumerate(top.evidence) if e.startswith("rank 2 is busy"))
    assert busy > top.evidence.index("cgroup_others_cpu_cores = 1.29 (peer median 0)")
