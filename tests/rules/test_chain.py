"""The rule base chains: hypotheses that rules derive and others consume, declared and typed as
knowledge; a site extends the chain from its own directory; conflicts are resolved by declarations."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from site_fixtures import SITE_TAXONOMY  # the same site root cause, reached through the chain

from eroica.cli.main import main
from eroica.engine.errors import RuleError
from eroica.engine.hypotheses import load_hypotheses
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.rules.compiler import compile_rules
from eroica.engine.rules.layers import KnowledgeSpec
from eroica.engine.rules.loader import load_rules
from eroica.engine.taxonomy import load_taxonomy

ROOT = Path(__file__).parents[2]

SITE_DERIVE = """schema: eroica.rule/v1
id: site.metrics-bound
title: A straggler whose excess is in our metrics call
status: experimental
severity: medium
owner: site-sre
when:
  - {fact: straggler, as: slow, where: {rank: $rank}}
  - {fact: category_excess, as: reg, where: {rank: $rank, category: region, top_function: log_metrics,
                                             explains_ratio: {gte: 0.5}}}
emit:
  confidence: 1.0
  summary: Rank {slow.rank} is held up in log_metrics.
  derive: {kind: metrics_bound, function: $reg.top_function, seconds_per_step: $reg.seconds_per_step}
tests:
  - name: a straggler in log_metrics is metrics-bound
    given:
      - {kind: straggler, rank: 1, excess_step_ratio: 0.3}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.9}
    expect: [{kind: metrics_bound, rank: 1, function: log_metrics}]
  - name: quiet when log_metrics explains just under half
    given:
      - {kind: straggler, rank: 1, excess_step_ratio: 0.3}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.49}
    expect: []
"""

SITE_CONCLUDE = """schema: eroica.rule/v1
id: site.metrics-endpoint
title: Our metrics endpoint blocks the training step
status: experimental
severity: medium
taxonomy: metrics_endpoint_slow
owner: site-sre
when:
  - {fact: metrics_bound, as: m, where: {rank: $rank}}
emit:
  confidence: 0.9
  function: $m.function
  summary: Rank {m.rank} waits on the metrics endpoint in {m.function}.
tests:
  - name: fires through the whole chain from the measured facts
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.3}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.9}
    expect: [{rank: 1, root_cause: metrics_endpoint_slow, function: log_metrics}]
  - name: quiet when the rank is no straggler
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.049}
      - {kind: category_excess, rank: 1, category: region, top_function: log_metrics, explains_ratio: 0.9}
    expect: []
"""


SITE_HYPOTHESES = """schema: eroica.hypotheses/v1
hypotheses:
  metrics_bound:
    description: A straggler whose excess is in the site's metrics call.
    evidence: "reasoning: its excess is in {function}"
    fields: {function: str, seconds_per_step: float}
"""


def site(tmp: Path) -> Path:
    k = tmp / "site-knowledge"
    (k / "rules").mkdir(parents=True)
    (k / "rules" / "metrics_bound.yaml").write_text(SITE_DERIVE)
    (k / "rules" / "metrics_endpoint.yaml").write_text(SITE_CONCLUDE)
    (k / "taxonomy.yaml").write_text(SITE_TAXONOMY)
    (k / "hypotheses.yaml").write_text(SITE_HYPOTHESES)
    return k


def test_a_site_rule_consumes_a_shipped_hypothesis_and_extends_the_chain(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    shipped = {p: p.read_bytes() for p in (ROOT / "knowledge").rglob("*") if p.is_file()}
    k = site(tmp_path)
    assert main(["rules", "lint", "--knowledge", str(k)]) == 0
    assert main(["rules", "test", "--knowledge", str(k)]) == 0
    out = capsys.readouterr().out
    assert "PASS  site.metrics-endpoint: fires through the whole chain from the measured facts" in out
    d = diagnose(ROOT / "incidents" / "INC-0013",
                 DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(site_dirs=(k,))))
    top = d.windows[0].findings[0]
    assert (top.root_cause, top.ranks, top.function) == ("metrics_endpoint_slow", [3], "log_metrics")
    assert top.derived_via == ["straggler.detected", "site.metrics-bound"]
    assert any(e.startswith("reasoning: straggler -> metrics_bound -> metrics_endpoint_slow") for e in top.evidence)
    assert shipped == {p: p.read_bytes() for p in (ROOT / "knowledge").rglob("*") if p.is_file()}


def test_at_least_a_third_of_the_shipped_conclusions_go_through_a_hypothesis() -> None:
    rules = [lr.rule for lr in load_rules()]
    hyp = set(load_hypotheses())
    conclusions = [r for r in rules if r.emit.derive is None]
    chained = [r for r in conclusions if any(c.fact in hyp for c in r.when)]
    assert len(chained) * 3 >= len(conclusions), (len(chained), len(conclusions))
    # every declared hypothesis is derived by a shipped rule and consumed by another
    derived = {r.emit.derive["kind"] for r in rules if r.emit.derive}
    consumed = {c.fact for r in rules for c in r.when}
    assert hyp == derived and hyp <= consumed


def _rule(tmp: Path, derive: str) -> Path:
    p = tmp / "thing.yaml"
    p.write_text(f"""schema: eroica.rule/v1
id: test.thing
title: t
status: experimental
severity: low
owner: me
when:
  - {{fact: rank_slowness, as: slow, where: {{rank: $rank}}}}
emit:
  confidence: 1.0
  summary: s
  derive: {derive}
""")
    return p


@pytest.mark.parametrize("derive, says", [
    ("{kind: mystery, x: 1}", "hypothesis 'mystery' is not declared"),
    ("{kind: job_slow, step_ratio_to_baseline: 1.0}", "needs excess_step_ratio, ranks_standing_out"),
    ("{kind: rank_slowness, group: g}", "'rank_slowness' is a measured fact"),
])
def test_a_derived_fact_must_be_a_declared_hypothesis_with_its_fields(tmp_path: Path, derive: str, says: str) -> None:
    with pytest.raises(RuleError) as e:
        compile_rules(load_rules([_rule(tmp_path, derive)]))
    assert says in "\n".join(e.value.problems)


def test_the_engine_names_no_root_cause_resolution_is_declared_in_the_taxonomy() -> None:
    ids = set(load_taxonomy())
    for f in ("engine/pipeline.py", "engine/findings.py", "engine/taxonomy.py"):
        text = (ROOT / f).read_text()
        named = {i for i in ids if re.search(rf"""["']{i}["']""", text)}
        assert not named, f"{f} special-cases {named}"
    tax = load_taxonomy()
    assert tax["unknown"].superseded_by == ("*",) and tax["workload_imbalance"].generic


@pytest.mark.parametrize("incident", ["INC-0017", "INC-0020", "INC-0032", "INC-0036", "INC-0019"])
def test_the_printed_factors_multiply_to_the_printed_confidence(incident: str) -> None:
    d = diagnose(ROOT / "incidents" / incident, DiagnoseOptions(in_process=True))
    findings = [f for w in d.windows for f in w.findings]
    assert findings
    for f in findings:
        c = f.confidence_factors
        product = math.prod([c.rule_ratio, c.deviation_strength_ratio, c.step_consistency_ratio, c.peer_group_ratio,
                              c.coverage_ratio, c.window_consistency_ratio, c.explained_away_ratio,
                              c.evidence_gap_ratio])
        assert f.confidence == pytest.approx(product, abs=2e-3), (incident, f.root_cause, c)


def test_a_rule_that_needs_evidence_the_rank_could_not_collect_lowers_its_confidence(tmp_path: Path) -> None:
    """The collector's gaps are facts: the kernel-imbalance rule needs GPU evidence to tell more work from
    a slower device; an offline trace has none, so its finding says so and costs half its confidence."""
    from patterns_factory import make_doc, write_run

    def run(gaps: list[tuple[str, str]], d: Path) -> object:
        docs = [make_doc(r, step=0.2, busy={"kernel:gemm": 0.3 if r == 2 else 0.1}, gaps=gaps) for r in range(4)]
        return diagnose(write_run(d, docs), DiagnoseOptions(in_process=True)).windows[0].findings[0]

    seen = run([], tmp_path / "a")
    blind = run([("nvml", "no GPU on this host")], tmp_path / "b")
    assert seen.root_cause == blind.root_cause == "workload_imbalance" and seen.ranks == blind.ranks == [2]
    f = blind.confidence_factors
    assert (f.evidence_gap_ratio, f.evidence_missing) == (0.5, ["nvml"])
    assert seen.confidence_factors.evidence_gap_ratio == 1.0
    assert blind.confidence == pytest.approx(seen.confidence * 0.5, abs=2e-3)
    assert "nvml evidence missing on rank 2: no GPU on this host" in blind.evidence


def test_reports_show_each_rules_lifecycle_status_the_chain_and_every_factor(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.md"
    assert main(["diagnose", str(ROOT / "incidents" / "INC-0032"), "--format", "md", "-o", str(out)]) == 0
    md = out.read_text()
    assert "Rules: cpu.contention (experimental), via straggler.detected → compute.bound → cpu.starved." in md
    # every factor: a generic explanation's confidence halved by the specific one on the same rank
    assert main(["diagnose", str(ROOT / "incidents" / "INC-0026"), "--format", "md", "-o", str(out)]) == 0
    md = out.read_text()
    assert "x explained away 0.50 = 0.36 (" in md and "explained away: by slow_storage)" in md, md
    # its cost is the specific cause's excess on the same rank: said once, never added twice
    assert md.count("accelerator-hours lost per hour") == 1
    assert "**Cost**: the same excess as `slow_storage` above, on the same rank (not added to it)." in md
    assert "Runbook: [knowledge/runbooks/slow_storage.md](file://" in md
    # the JSON says it too: costs summed over a window's findings count each excess once
    assert main(["diagnose", str(ROOT / "incidents" / "INC-0026"), "--format", "json", "-o", str(out)]) == 0
    found = json.loads(out.read_text())["windows"][0]["findings"]
    costs = [(f["root_cause"], f["cost"]["same_excess_as"]) for f in found]
    assert costs == [("slow_storage", None), ("user_code", "slow_storage")], costs
    html = tmp_path / "r.html"
    assert main(["diagnose", str(ROOT / "incidents" / "INC-0032"), "--format", "html", "-o", str(html)]) == 0
    page = html.read_text()
    assert "cpu.contention (experimental)" in page
    assert "<tr><td>consistency</td>" in page and "<tr><td>steps</td>" not in page     # the text's own labels


def test_hypothesis_models_are_built_only_when_a_rule_derived_one() -> None:
    """A window where no rule derived anything types its results without the hypothesis models, which
    are built from knowledge files (~2 ms each of a short `eroica diagnose`); one derived hypothesis
    builds its own model, not the others'."""
    from eroica.engine import hypotheses
    from eroica.engine.rules.conclusion import typed_results

    hypotheses._model_at.cache_clear()
    assert typed_results(([], [])) == ([], [])
    assert hypotheses._model_at.cache_info().currsize == 0
    straggler = {"kind": "straggler", "rank": 3, "group": "g", "excess_step_ratio": 0.2,
                 "excess_seconds_per_step": 0.01, "consistency_ratio": 0.9, "comm_wait_ratio_to_median": 0.1,
                 "least_waiting": True}
    _, derived = typed_results(([], [{"rule_id": "straggler.busy", "fact": straggler}]))
    assert hypotheses._model_at.cache_info().currsize == 1 < len(hypotheses.load_hypotheses())
    assert type(derived[0].fact) is hypotheses.load_hypotheses()["straggler"]     # the same model as the rules'
    assert type(derived[0].fact).__name__ == "Hypothesis_straggler" and derived[0].fact.rank == 3
