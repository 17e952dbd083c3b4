"""End to end, a culprit over a job's life on live 4-rank jobs: a loader stall switched on and off on
one rank (intermittent), and one that moves from rank to rank (rotating: something the ranks share).
The detector opens each window by itself; the story is read over all of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose
from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def story_of(tmp: Path, rank: int, extra: list[str]):  # type: ignore[no-untyped-def]
    res = launch(tmp, fault="dataloader_stall", fault_rank=rank, fault_step=30, steps=240,
                 extra_args=["--on-off", "40", "--stop-after-windows", "3", *extra], progress=False)
    assert res.ok, f"job failed: {res.returncodes}\n" + "\n".join(
        f"--- rank {r}\n{t[-1500:]}" for r, t in res.logs.items())
    d = diagnose(tmp)
    seen = [(w.window, w.trigger, [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in w.findings])
            for w in d.windows]
    return d, seen


def test_a_loader_stall_switched_on_and_off_is_intermittent(tmp_path: Path) -> None:
    d, seen = story_of(tmp_path, 2, [])
    assert len(d.windows) >= 2 and all(w.trigger == "detector" for w in d.windows), seen
    stories = [s for s in d.story if s.root_cause == "dataloader_stall"]
    assert [(s.kind, s.ranks) for s in stories] == [("intermittent", [2])], (d.story, seen)
    assert stories[0].windows_seen_total >= 2 and "healthy between" in stories[0].summary
    assert not [s for s in d.story if s.root_cause != "dataloader_stall"], d.story


def test_a_loader_stall_that_moves_from_rank_to_rank_is_rotating(tmp_path: Path) -> None:
    d, seen = story_of(tmp_path, 1, ["--rotate-every", "80"])
    stories = [s for s in d.story if s.root_cause == "dataloader_stall"]
    assert [s.kind for s in stories] == ["rotating"], (d.story, seen)
    assert len(stories[0].ranks) >= 2 and stories[0].ranks[0] == 1, stories[0]
    assert "look at what they share" in stories[0].summary
    # each window names the rank the stall was on then, never two at once
    for w in d.windows:
        assert len({tuple(f.ranks) for f in w.findings if f.root_cause == "dataloader_stall"
                    and f.confidence >= 0.5}) <= 1, seen
