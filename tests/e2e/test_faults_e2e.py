"""End to end: real 4-rank gloo training, a real fault on one rank after a healthy phase, eroica's own
detector opening a synchronized window, and the diagnosis naming the root cause and the rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eroica.cli.launch import CPU_ROOT, launch
from eroica.engine.diagnose import diagnose

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

CGROUP_V1 = (CPU_ROOT / "cgroup.procs").exists() and os.access(CPU_ROOT, os.W_OK)


def run_job(tmp_path: Path, fault: str, rank: int, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    res = launch(tmp_path, fault=fault, fault_rank=rank, fault_step=25, steps=90, env=env, progress=False)
    assert res.ok, f"job failed: {res.returncodes}\n" + "\n".join(
        f"--- rank {r}\n{t[-2000:]}" for r, t in res.logs.items())
    return diagnose(tmp_path)


@pytest.mark.parametrize(
    ("fault", "rank", "function_hint"),
    [
        ("dataloader_stall", 1, "DataLoader"),
        ("workload_imbalance", 3, ""),
        ("gc_pause", 2, "gc.collect"),
        pytest.param("cpu_throttled", 0, "", marks=pytest.mark.skipif(
            not CGROUP_V1, reason="needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu (root)")),
    ],
)
def test_fault_is_found_named_and_explained(tmp_path: Path, fault: str, rank: int, function_hint: str) -> None:
    d = run_job(tmp_path, fault, rank)
    assert len(d.windows) == 1
    w = d.windows[0]
    assert w.trigger == "detector"                        # the detector fired by itself
    assert w.start_step > 25                              # after the fault began
    assert w.coverage.ranks_reported == [0, 1, 2, 3]
    assert w.findings, f"no finding; steps {w.steps}"
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == (fault, [rank]), [(f.root_cause, f.ranks, f.confidence) for f in w.findings]
    assert top.confidence >= 0.5
    assert function_hint in (top.function or "")
    victims = {r for f in w.findings if f.confidence >= 0.5 for r in f.ranks} - {rank}
    assert not victims, f"ranks that only waited were blamed: {victims}"
    if CGROUP_V1:
        assert not list(CPU_ROOT.glob("eroica-job-*")), "cgroups left behind"


def test_healthy_run_gives_no_confident_finding(tmp_path: Path) -> None:
    d = run_job(tmp_path, "none", 0, env={"EROICA_FORCE_WINDOW_AT_STEP": "24"})
    assert len(d.windows) == 1 and d.windows[0].trigger == "forced"
    assert not [f for f in d.windows[0].findings if f.confidence >= 0.5]
