"""The rule-authoring guide's example rule is tested, linted and used, exactly as the guide says."""

from __future__ import annotations

import json
import re
from pathlib import Path

from eroica.cli.main import main

ROOT = Path(__file__).parents[2]


def guide_rule() -> str:
    text = (ROOT / "docs" / "rule-authoring.md").read_text()
    block = re.search(r"<!-- guide-rule:start -->\s*```yaml\n(.*?)```\s*<!-- guide-rule:end -->", text, re.S)
    assert block, "the guide's rule block is missing"
    return block.group(1)


def test_the_guides_rule_passes_its_tests_lint_and_diagnoses_the_incident(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "my-rules"
    rules.mkdir()
    (rules / "loader_waits_not_computes.yaml").write_text(guide_rule())
    assert main(["rules", "test", str(rules)]) == 0
    assert "4 passed, 0 failed" in capsys.readouterr().out
    assert main(["rules", "lint", str(rules)]) == 0
    capsys.readouterr()
    out = tmp_path / "d.json"
    run = ROOT / "incidents" / "INC-0001" / "patterns"
    assert main(["diagnose", str(run), "--rules", str(rules), "--format", "json", "-o", str(out)]) == 0
    top = json.loads(out.read_text())["windows"][0]["findings"][0]
    assert top["root_cause"] == "dataloader_stall"
    assert "site.loader-waits-not-computes" in top["rule_ids"]


def test_facts_are_printed_for_authors(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["diagnose", str(ROOT / "incidents" / "INC-0001" / "patterns"), "--facts"]) == 0
    kinds = {json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()}
    assert {"rank_slowness", "function_outlier", "category_excess", "hw_signal"} <= kinds
