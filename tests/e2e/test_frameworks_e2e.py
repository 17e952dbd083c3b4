"""Zero-code attach on the stacks people train with, each script untouched under `eroica run --
torchrun --nproc-per-node 4` (CPU, gloo): Hugging Face `transformers.Trainer` (with `accelerate`),
PyTorch Lightning's DDP strategy, FSDP2 (`fully_shard`), and pipeline parallelism
(`torch.distributed.pipelining`, 2 stages x 2 replicas). Healthy: a forced window and no finding
>= 0.5. Faulty (rank 1's input pipeline stalls): the cause, the rank and the function, as the explicit
API's tests assert; for the pipeline, the peers are the other replica of the stage (from the
DeviceMesh's "pp" groups), and with one peer the report says it cannot vouch for the comparison: the
finding stands on the expected-range rule (the loader's share of the rank's own step), at most its prior.
The packages come with the `frameworks` extra, which `make` installs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]

STACKS = {   # script, the packages it needs, its steps (HF's processes are slow to start)
    "hf-trainer": ("train_hf.py", ("transformers", "accelerate"), 70),
    "lightning": ("train_lightning.py", ("lightning",), 80),
    "fsdp2": ("train_fsdp.py", (), 80),
    "pipeline": ("train_pipeline.py", (), 80),
}


def _skip_unless(mods: tuple[str, ...]) -> None:
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -e '.[frameworks]' (make does)")


def run_stack(name: str, out: Path, *args: str, env: dict[str, str] | None = None) -> None:
    script, mods, steps = STACKS[name]
    _skip_unless(("torch", *mods))
    cmd = [sys.executable, "-m", "eroica.cli.main", "run", "--out", str(out), "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / script),
           "--steps", str(steps), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500, cwd=out.parent,
                       env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    log = p.stdout[-3000:] + p.stderr[-4000:]
    assert p.returncode == 0, log
    assert "eroica attach" not in p.stderr, log


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_stalled_loader_on_rank_1_is_found_untouched_on_each_stack(tmp_path: Path, stack: str) -> None:
    run_stack(stack, tmp_path / "faulty", "--fault", "dataloader_stall", "--fault-rank", "1")
    d = diagnose(tmp_path / "faulty")
    assert d.windows, "no window opened"
    w = d.windows[0]
    assert w.coverage.ranks_reported == [0, 1, 2, 3]
    top = max(w.findings, key=lambda f: f.confidence)
    assert (top.root_cause, top.ranks, top.function) == ("dataloader_stall", [1], "DataLoader.__next__"), top
    assert top.confidence >= 0.5, top
    if stack != "pipeline":
        return
    groups = {g.name: g.ranks for g in w.peer_groups}
    assert groups == {"worker/mesh_pp0": [0, 2], "worker/mesh_pp1": [1, 3]}, groups     # the stages
    # two replicas cannot vouch for each other: the peer-based stall rule is halved, and the finding
    # stands on the rule that judges the rank's own step against the expected range, bounded by its prior
    f = top.confidence_factors
    assert top.insufficient_peer_evidence and f.prior_rule_id == "range.data-share", f
    assert top.confidence <= f.rule_ratio and "straggler.dataloader-stall" in top.rule_ids, top
    assert "only 2 rank(s) in group 'worker/mesh_pp1'" in f.peer_group
    assert "judged against the expected range" in f.peer_group


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_healthy_run_on_each_stack_stays_quiet(tmp_path: Path, stack: str) -> None:
    run_stack(stack, tmp_path / "healthy", env={"EROICA_FORCE_WINDOW_AT_STEP": "40"})
    d = diagnose(tmp_path / "healthy")
    assert d.windows and d.windows[0].coverage.ranks_reported == [0, 1, 2, 3]
    loud = [(f.root_cause, f.ranks, round(f.confidence, 2)) for w in d.windows for f in w.findings
            if f.confidence >= 0.5]
    assert loud == [], loud
