"""Without a shared filesystem: the ranks gather their patterns to rank 0 over a separate gloo
group of the job's own torch.distributed, and rank 0 writes one packed file per window."""

from __future__ import annotations

from pathlib import Path

import pytest
from retry import twice

from eroica.engine.diagnose import diagnose
from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def test_patterns_gathered_to_rank_0_are_diagnosed(tmp_path: Path) -> None:
    twice(check, tmp_path)


def check(tmp_path: Path) -> None:
    res = launch(tmp_path, fault="dataloader_stall", fault_rank="2", fault_step=25, steps=100,
                 env={"EROICA_GATHER": "1"}, progress=False)
    assert res.ok, res.returncodes
    (wdir,) = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("w")]
    assert sorted(p.name for p in wdir.iterdir()) == ["pack-gathered.jsonl"]      # no per-rank files
    assert len((wdir / "pack-gathered.jsonl").read_text().splitlines()) == 4
    (w,) = diagnose(tmp_path).windows
    assert w.coverage.ranks_reported == [0, 1, 2, 3]
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == ("dataloader_stall", [2]) and top.confidence >= 0.5
