"""The mistakes a new rule author made in a second trial: each is said once, with its file and line and
what to do, and none ends in a traceback or drowns in errors about the shipped rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eroica.cli.main import main
from eroica.engine.rules.layers import KnowledgeSpec, load

ROOT = Path(__file__).parents[2]
RULE = ROOT / "docs" / "rule-authoring.md"


def guide_rule() -> str:
    text = RULE.read_text()
    return text.split("<!-- guide-rule:start -->\n```yaml\n", 1)[1].split("```", 1)[0]


def site(tmp: Path, taxonomy: str | None = None, rule: str | None = None) -> Path:
    d = tmp / "site"
    (d / "rules").mkdir(parents=True, exist_ok=True)
    (d / "taxonomy.yaml").write_text(taxonomy or (
        "root_causes:\n  metrics_endpoint_slow: {category: software, component: metrics, question: q, "
        "runbook: https://wiki.example.com/m}\n"))
    (d / "rules" / "metrics_endpoint.yaml").write_text(rule or guide_rule())
    return d


def problems(d: Path) -> list[str]:
    return load(KnowledgeSpec(site_dirs=(d,)), raise_problems=False).problems


@pytest.mark.parametrize(("entry", "says"), [
    ("{category: hardwear, component: c, question: q, runbook: https://x}",
     "category 'hardwear' is hardware or software"),
    ("{category: software, component: c, questoin: q, runbook: https://x}", "unknown key 'questoin'; did you mean "
                                                                           "question?"),
    ("{category: software, component: c, runbook: https://x}", "needs `question:`"),
    ("{category: software, component: c, question: q, runbook: https://x, decided_by: [{fact: function_outlir, "
     "where: {}}]}", "decided_by names fact 'function_outlir'; did you mean function_outlier?"),
])
def test_a_wrong_site_root_cause_is_one_problem_with_its_line_not_forty(tmp_path: Path, entry: str, says: str) -> None:
    d = site(tmp_path, f"root_causes:\n  metrics_endpoint_slow: {entry}\n")
    got = problems(d)
    mine = [p for p in got if says in p]
    assert mine and mine[0].startswith(f"{d / 'taxonomy.yaml'}:2: root cause 'metrics_endpoint_slow'"), got
    assert not any("user_code" in p for p in got)          # the shipped rules keep their taxonomy


def test_a_misspelt_taxonomy_key_and_a_redefined_shipped_cause(tmp_path: Path) -> None:
    d = site(tmp_path, "root_cause:\n  x: {category: software, component: c, question: q, runbook: r}\n")
    assert any("'root_cause': a site's taxonomy adds root causes (`root_causes:`); did you mean root_causes?" in p
               for p in problems(d))
    d = site(tmp_path, "root_causes:\n  slow_storage: {category: software, component: c, question: q, runbook: r}\n")
    got = problems(d)
    assert any("root cause 'slow_storage' is already in the taxonomy" in p for p in got)
    assert len(got) <= 2, got                              # the site's rule then names an unknown cause: that's all


def test_site_hypotheses_mistakes_are_problems_not_tracebacks(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    d = site(tmp_path)
    for body, says in (("fields: [function]", "`fields` maps each field to its type"),
                       ("fields: {seconds_per_step: flaot}", "unknown type 'flaot'"),
                       ("fields: {}", None)):
        (d / "hypotheses.yaml").write_text(f"schema: eroica.hypotheses/v1\nhypotheses:\n  straggler_x:\n"
                                           f"    description: d\n    evidence: e\n    {body}\n")
        for cmd in (["rules", "lint"], ["rules", "list"], ["rules", "vocabulary"]):
            rc = main([*cmd, "--knowledge", str(d)])
            out = capsys.readouterr()
            if says:
                assert says in out.out + out.err and (rc == 1 or cmd[1] != "lint"), (cmd, out)
    (d / "hypotheses.yaml").write_text("schema: eroica.hypotheses/v1\nhypotheses:\n  straggler: {description: d, "
                                       "evidence: e, fields: {x: int}}\n")
    assert any("hypothesis 'straggler' already exists" in p for p in problems(d))


def test_files_and_folders_in_the_wrong_place_are_named(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    d = site(tmp_path)
    assert main(["rules", "coverage", str(d), "--knowledge", str(d)]) == 2
    assert "no incident (a folder with expected.yaml)" in capsys.readouterr().err
    shutil.copy(d / "rules" / "metrics_endpoint.yaml", d / "rules" / "other.YAML")
    assert any("other.YAML: rule files end in .yaml; rename it" in p for p in problems(d))
    (d / "rules" / "other.YAML").unlink()
    k = load(KnowledgeSpec(site_dirs=(d,)), raise_problems=False)
    assert k.entry("site.metrics-endpoint") is not None    # a bad file beside it hides no good rule
    shutil.move(d / "taxonomy.yaml", d / "rules" / "taxonomy.yaml")
    assert any("rules/taxonomy.yaml would never be read there: it belongs in" in p for p in problems(d))
    nested = tmp_path / "outer"
    shutil.copytree(d, nested / "knowledge")
    assert any("knowledge/ is a site directory of its own: did you mean --knowledge" in p
               for p in problems(nested))


def test_rule_mistakes_lint_used_to_pass(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    text = guide_rule()
    d = site(tmp_path, rule=text.replace("{rank: $rank, category: region", "{rank: $rnk, category: region"))
    assert any("$rnk and $rank each bind 'rank' in one condition and join nothing: a typo?" in p for p in problems(d))
    d = site(tmp_path, rule=text.replace("severity: medium\n", "severity: medium\nseverity: high\n"))
    assert any("key 'severity' appears twice in one mapping" in p for p in problems(d))
    d = site(tmp_path, rule=text.replace("excess_step_ratio: {gte: 0.05}", "excess_step_ratio: 0.25"))
    assert any("compares the measured rank_slowness.excess_step_ratio with 0.25 exactly" in p for p in problems(d))
    # a whole number is no exception (a rule comparing a measured ratio with 10 never fired); 0 is: none of it
    d = site(tmp_path, rule=text.replace("excess_step_ratio: {gte: 0.05}", "excess_step_ratio: 1"))
    assert any("compares the measured rank_slowness.excess_step_ratio with 1 exactly" in p for p in problems(d))
    d = site(tmp_path, rule=text.replace("excess_step_ratio: {gte: 0.05}", "excess_step_ratio: 0"))
    assert not any("exactly" in p for p in problems(d))
    d = site(tmp_path, rule=text.replace("excess_step_ratio: {gte: 0.05}", "excess_step_ratio: {gte: 25}"))
    assert any("threshold 25 is outside the range of rank_slowness.excess_step_ratio (0..1)" in p
               for p in problems(d))
    d = site(tmp_path, rule=text.replace("expect: [{rank: 1, root_cause:", "expect: [{rank: 1, root_cuase:"))
    assert main(["rules", "lint", "--knowledge", str(d)]) == 1
    assert "expects 'root_cuase', which no conclusion has; did you mean root_cause?" in capsys.readouterr().out
    d = site(tmp_path, rule=text.replace("category: region, top_function: log_metrics, explains_ratio: 0.49",
                                         "category: regoin, top_function: log_metrics, explains_ratio: 0.49"))
    assert main(["rules", "test", str(d / "rules" / "metrics_endpoint.yaml"), "--knowledge", str(d)]) == 1
    out = capsys.readouterr().out
    assert "category_excess.category = 'regoin' is never stated; closest: region" in out
    assert "give facts that never happen" in out


def test_an_override_file_given_as_rules_and_a_site_given_as_overrides(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    o = tmp_path / "tune.yaml"
    o.write_text("overrides:\n  runtime.gc-pause: {disabled: true, reason: r}\n")
    inc = str(ROOT / "incidents" / "INC-0004")
    assert main(["diagnose", inc, "--rules", str(o)]) == 2
    assert "an override file, not a rule: pass it with --overrides" in capsys.readouterr().err
    assert main(["diagnose", inc, "--overrides", str(tmp_path)]) == 2
    assert "a site directory goes with --knowledge DIR" in capsys.readouterr().err
    assert main(["diagnose", inc, "--overrides", str(o)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("knowledge: the shipped rules, changed by the site: runtime.gc-pause disabled at")
    assert "with the rules the site disabled (see knowledge above)" in out
