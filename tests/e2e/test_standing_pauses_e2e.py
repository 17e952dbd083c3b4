"""A pause the job has always made is its design, not the slowdown: real 4-rank gloo jobs where rank 0
alone saves a checkpoint every N steps while the others wait in a barrier, and a window (forced at
step 52, as a detector firing on a noisy machine's burst would open one) covers a checkpoint.

- The checkpoint is as long as it always was: the finding on rank 0's `save_checkpoint` keeps half its
  confidence (below 0.5: the window is healthy), and says which earlier step showed the same pause.
- Every 5 steps, the checkpoint became four times longer from step 45 (its disk became slow): the job's own series shows
  shorter pauses before, so the same finding stays confident."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose
from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def run(tmp: Path, extra: list[str]) -> None:
    res = launch(tmp, steps=62, timeout_seconds=150, progress=False, env={"EROICA_FORCE_WINDOW_AT_STEP": "52"},
                 extra_args=["--stop-after-windows", "1", *extra])
    assert all(rc == 0 for rc in res.returncodes), res.logs


def test_a_checkpoint_as_long_as_it_always_was_is_by_design_not_the_slowdown(tmp_path: Path) -> None:
    run(tmp_path, ["--ckpt0-every", "20", "--ckpt0-seconds", "1.0"])
    (w,) = diagnose(tmp_path).windows
    assert w.healthy, [(f.root_cause, f.ranks, f.confidence) for f in w.findings]
    mine = [f for f in w.findings if f.function == "save_checkpoint"]
    assert mine, "the checkpoint is present: its finding is listed, below the threshold"
    for f in mine:
        assert f.ranks == [0] and f.confidence < 0.5, f
        assert f.confidence_factors.standing_ratio == 0.5, f.confidence_factors
        assert f.confidence_factors.standing_step is not None and 10 <= f.confidence_factors.standing_step < 52
        assert "present by design" in f.summary and "standing 0.50" in f.confidence_factors.explain(f.confidence)


def test_a_checkpoint_that_became_four_times_longer_stays_a_confident_finding(tmp_path: Path) -> None:
    run(tmp_path, ["--ckpt0-every", "5", "--ckpt0-seconds", "0.25", "--ckpt0-slow-step", "45"])
    (w,) = diagnose(tmp_path).windows
    top = w.findings[0] if w.findings else None
    assert top is not None and top.ranks == [0] and top.function == "save_checkpoint" and top.confidence >= 0.5, \
        [(f.root_cause, f.ranks, f.function, f.confidence) for f in w.findings]
    assert top.confidence_factors.standing_ratio == 1.0 and not w.healthy
