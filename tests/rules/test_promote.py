"""The rules' lifecycle: `eroica rules promote` lists (and with no --dry-run, applies) the experimental
rules that diagnose enough recorded incidents and never fired on a healthy run."""

from __future__ import annotations

import shutil
from pathlib import Path

from eroica.cli.main import main
from eroica.engine.evaluate import promotion_candidates
from eroica.engine.pipeline import DiagnoseOptions
from eroica.engine.rules.loader import load_rules

ROOT = Path(__file__).parents[2]


def test_dry_run_lists_the_ready_rules_and_changes_nothing(capsys) -> None:  # type: ignore[no-untyped-def]
    before = {p: p.read_text() for p in (ROOT / "knowledge" / "rules").rglob("*.yaml")}
    assert main(["rules", "promote", "--dry-run", "--incidents", str(ROOT / "incidents")]) == 0
    out = capsys.readouterr().out
    assert "would promote code.blocking-region to stable" in out
    # a healthy held-out run has a confident dataloader_stall (HO-0301, the GPU job): not ready
    assert "straggler.dataloader-stall" not in out
    assert "network.capped-link" not in out                    # two incidents: not yet
    assert before == {p: p.read_text() for p in (ROOT / "knowledge" / "rules").rglob("*.yaml")}


def test_a_rule_whose_incidents_are_not_all_there_or_that_fired_on_a_healthy_run_is_not_ready(tmp_path: Path) -> None:
    for inc in ("INC-0001", "INC-0006", "INC-0005"):
        shutil.copytree(ROOT / "incidents" / inc, tmp_path / inc)
    cands = promotion_candidates(tmp_path, load_rules(), 2, DiagnoseOptions(in_process=True))
    assert "straggler.dataloader-stall" not in {c.rule_id for c in cands}   # 5 of its 7 incidents are missing
    (tmp_path / "INC-0001" / "expected.yaml").write_text("expect: []\n")  # now a 'healthy' run it fires on
    for inc in ("INC-0006", "INC-0010", "INC-0011", "INC-0019", "INC-0038", "INC-0042"):
        if not (tmp_path / inc).exists():
            shutil.copytree(ROOT / "incidents" / inc, tmp_path / inc)
    cands = promotion_candidates(tmp_path, load_rules(), 2, DiagnoseOptions(in_process=True))
    assert "straggler.dataloader-stall" not in {c.rule_id for c in cands}
