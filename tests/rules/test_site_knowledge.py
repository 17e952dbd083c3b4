"""A site's own knowledge directory: new root causes in its taxonomy, rules that use them, overrides;
`eroica rules test|lint` take it as `eroica diagnose` does, without touching the shipped files."""

from __future__ import annotations

from pathlib import Path

from site_fixtures import SITE_TAXONOMY

from eroica.cli.main import main
from eroica.engine.errors import RuleError
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.rules.layers import KnowledgeSpec
from eroica.engine.taxonomy import load_taxonomy

ROOT = Path(__file__).parents[2]

SITE_RULE = """schema: eroica.rule/v1
id: site.metrics-endpoint
title: Our metrics endpoint blocks the training step
status: experimental
severity: medium
taxonomy: metrics_endpoint_slow
owner: site-sre
when:
  - {fact: rank_slowness, as: slow, where: {rank: $rank, excess_step_ratio: {gte: 0.05}}}
  - {fact: category_excess, as: reg, where: {rank: $rank, category: region, top_function: log_metrics,
                                             explains_ratio: {gte: 0.5}}}
emit:
  confidence: 0.9
  function: $reg.top_function
  summary: Rank {slow.rank} waits on the metrics endpoint in {reg.top_function}.
tests:
  - name: fires when log_metrics explains the excess
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.3}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.9}
    expect: [{rank: 1, root_cause: metrics_endpoint_slow, function: log_metrics}]
  - name: quiet when log_metrics explains just under half
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.3}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.49}
    expect: []
  - name: quiet when the rank costs the job too little
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.049}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.9}
    expect: []
"""



def site(tmp: Path) -> Path:
    k = tmp / "site-knowledge"
    (k / "rules").mkdir(parents=True)
    (k / "rules" / "metrics_endpoint.yaml").write_text(SITE_RULE)
    (k / "taxonomy.yaml").write_text(SITE_TAXONOMY)
    (k / "overrides").mkdir()
    (k / "overrides" / "site.yaml").write_text(
        "overrides:\n  code.blocking-region: {confidence: 0.5, reason: our metrics calls are rare}\n")
    return k


def test_a_site_adds_a_root_cause_and_a_rule_without_touching_the_shipped_files(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    k = site(tmp_path)
    assert main(["rules", "lint", "--knowledge", str(k)]) == 0
    assert main(["rules", "test", "--knowledge", str(k)]) == 0
    out = capsys.readouterr().out
    assert "PASS  site.metrics-endpoint: fires when log_metrics explains the excess" in out
    assert main(["rules", "lint"]) == 0           # without the site, its cause is unknown only to it
    d = diagnose(ROOT / "incidents" / "INC-0013",
                 DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(site_dirs=(k,))))
    top = d.windows[0].findings[0]
    assert (top.root_cause, top.component, top.ranks) == ("metrics_endpoint_slow", "site metrics service", [3])


def test_a_site_cannot_redefine_a_shipped_root_cause_and_is_told_where(tmp_path: Path) -> None:
    k = site(tmp_path)
    (k / "taxonomy.yaml").write_text("root_causes:\n  user_code: {category: software, component: x, question: y, "
                                     "runbook: z}\n")
    try:
        load_taxonomy(site_dirs=[k])
    except RuleError as exc:
        assert f"{k / 'taxonomy.yaml'}:2: root cause 'user_code' is already in the taxonomy" in str(exc)
    else:
        raise AssertionError("a redefined root cause was accepted")
