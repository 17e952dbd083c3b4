"""The fleet SIMULATOR (eroica simulate) against its own ground truth, through the real engine and
rules: the GPU-only faults no CPU machine can produce for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eroica.cli.main import main
from eroica.engine.pipeline import DiagnoseOptions, diagnose


@pytest.mark.parametrize("fault", ["dataloader_stall", "workload_imbalance", "gpu_throttled", "pcie_degraded",
                                   "nvlink_degraded", "gpu_hardware_error"])
def test_each_simulated_fault_is_named_on_its_rank(tmp_path: Path, fault: str) -> None:
    assert main(["simulate", "--ranks", "64", "--pp", "2", "--fault", fault, "--seed", "3", "-o", str(tmp_path)]) == 0
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    assert truth["simulator"].startswith("eroica simulate") and len(truth["ranks"]) == 1
    (w,) = diagnose(tmp_path, DiagnoseOptions(in_process=True)).windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == (fault, truth["ranks"]) and top.confidence >= 0.5
    r = truth["ranks"][0]                       # named where an SRE finds it: host and device (8 GPUs a host)
    assert top.devices == [f"node{r // 8:05d}/cuda:{r % 8}"] and top.placed == top.devices
    assert not any(f.confidence >= 0.5 for f in w.findings if f.ranks != truth["ranks"])
    # pipeline stages come from the process-group layout: two valid groups of 32
    assert sorted((g.name, len(g.ranks), g.valid) for g in w.peer_groups) == [("worker/pp0", 32, True),
                                                                              ("worker/pp1", 32, True)]


def test_two_ranks_whose_host_launches_late_are_one_finding(tmp_path: Path) -> None:
    assert main(["simulate", "--ranks", "64", "--tp", "8", "--fault", "host_launch_bound", "--culprits", "2",
                 "--seed", "5", "-o", str(tmp_path)]) == 0
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    (w,) = diagnose(tmp_path, DiagnoseOptions(in_process=True)).windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks, top.function) == ("host_launch_bound", truth["ranks"], "cudaLaunchKernel")
    assert top.confidence >= 0.5 and len(truth["ranks"]) == 2
    assert not any(f.confidence >= 0.5 for f in w.findings[1:])


def test_a_healthy_simulated_fleet_is_healthy(tmp_path: Path) -> None:
    assert main(["simulate", "--ranks", "256", "--fault", "none", "-o", str(tmp_path)]) == 0
    (w,) = diagnose(tmp_path, DiagnoseOptions(in_process=True)).windows
    assert w.healthy and not any(f.confidence >= 0.5 for f in w.findings)


def test_patterns_packed_per_host_read_like_files_per_rank(tmp_path: Path) -> None:
    assert main(["simulate", "--ranks", "64", "--fault", "gpu_throttled", "--packed", "-o", str(tmp_path / "p")]) == 0
    assert main(["simulate", "--ranks", "64", "--fault", "gpu_throttled", "-o", str(tmp_path / "f")]) == 0
    packed = list((tmp_path / "p" / "w000-s200").iterdir())
    assert len(packed) == 8 and all(p.name.startswith("host-node") and p.suffix == ".jsonl" for p in packed)
    a, b = (diagnose(tmp_path / x, DiagnoseOptions(in_process=True)).windows[0] for x in ("p", "f"))
    assert [(f.root_cause, f.ranks, f.confidence) for f in a.findings] == [
        (f.root_cause, f.ranks, f.confidence) for f in b.findings]
    # a broken line is named (file:line) and the rest of the host is still read
    host = packed[0]
    lines = host.read_text().splitlines()
    host.write_text("\n".join([lines[0][:50], *lines[1:]]) + "\n")
    w = diagnose(tmp_path / "p", DiagnoseOptions(in_process=True)).windows[0]
    assert len(w.coverage.ranks_reported) == 63 and any(f"{host.name}:1" in p for p in w.coverage.file_problems)


def test_a_dp_tp_pp_ep_layout_compares_each_rank_with_its_pipeline_stage_and_expert_shard(tmp_path: Path) -> None:
    """Experts of unequal load by design are never compared with each other; tensor-parallel
    positions do the same work and are."""
    assert main(["simulate", "--ranks", "512", "--tp", "8", "--pp", "4", "--ep", "2", "--fault", "gpu_throttled",
                 "--seed", "4", "--packed", "-o", str(tmp_path)]) == 0
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    assert truth["layout"] == {"dp": 16, "tp": 8, "pp": 4, "ep": 2}
    (w,) = diagnose(tmp_path, DiagnoseOptions(in_process=True)).windows
    assert sorted(g.name for g in w.peer_groups) == [f"worker/pp{p}/ep{e}" for p in range(4) for e in range(2)]
    assert all(g.valid and len(g.ranks) == 64 for g in w.peer_groups)
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == ("gpu_throttled", truth["ranks"]) and top.confidence >= 0.5
    assert main(["simulate", "--ranks", "100", "--tp", "8", "-o", str(tmp_path / "bad")]) == 2


def test_simulate_refuses_a_directory_that_holds_files_and_keeps_them(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    assert main(["simulate", "--ranks", "16", "--fault", "gpu_throttled", "-o", str(out)]) == 0
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    # a second simulation into it would leave the first's rank files beside its own, diagnosed together
    assert main(["simulate", "--ranks", "8", "--fault", "none", "-o", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # told to, it replaces the earlier simulation: only the new one's ranks are there
    assert main(["simulate", "--ranks", "8", "--fault", "none", "--replace", "-o", str(out)]) == 0
    assert len(list(out.rglob("rank-*.json"))) == 8
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["simulate", "--ranks", "8", "--fault", "none", "--replace", "-o", str(other)]) == 2
    assert (other / "notes.txt").read_text() == "keep me"                 # never removes what is not a simulation
    (tmp_path / "empty").mkdir()
    assert main(["simulate", "--ranks", "8", "--fault", "none", "-o", str(tmp_path / "empty")]) == 0
