"""Without a shared filesystem: the ranks gather their patterns to a leader (rank 0, or each host's
lowest rank) over a separate gloo group of the job's own torch.distributed, and the leader writes
one packed file per window."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eroica.collector.gather import host_file
from eroica.engine.pipeline import diagnose
from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scope", ["1", "host"])
def test_patterns_gathered_to_a_leader_are_diagnosed(tmp_path: Path, scope: str) -> None:
    res = launch(tmp_path, fault="dataloader_stall", fault_rank="2", fault_step=25, steps=100,
                 env={"EROICA_GATHER": scope}, progress=False)
    assert res.ok, res.returncodes
    (wdir,) = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("w")]
    # no per-rank pattern files: rank 0 for the job, or the host's lowest rank (here all four share one
    # host); the suspects' raw traces stay per rank, at most three
    name = "pack-gathered.jsonl" if scope == "1" else host_file(socket.gethostname())
    assert sorted(p.name for p in wdir.iterdir() if not p.name.endswith(".trace.json")) == [name]
    assert len(list(wdir.glob("rank-*.trace.json"))) <= 3
    assert len((wdir / name).read_text().splitlines()) == 4
    (w,) = diagnose(tmp_path).windows
    assert w.coverage.ranks_reported == [0, 1, 2, 3]
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == ("dataloader_stall", [2]) and top.confidence >= 0.5
