"""Every inline test of every shipped rule; test id = rule id + test name."""

from __future__ import annotations

import pytest

from eroica.engine.rules.authoring import cases, lint, lint_paths
from eroica.engine.rules.layers import load
from eroica.engine.rules.runner import RuleTestOutcome, run_tests

KNOWLEDGE = load(raise_problems=False)
RULES = KNOWLEDGE.rules
CASES, PROBLEMS = cases(KNOWLEDGE), KNOWLEDGE.problems


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, str], RuleTestOutcome]:
    return {(o.rule_id, o.name): o for o in run_tests(CASES)}   # one engine worker for all


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule_id}: {c.name}" for c in CASES])
def test_rule(case, outcomes) -> None:  # type: ignore[no-untyped-def]
    o = outcomes[(case.rule_id, case.name)]
    assert o.passed, o.detail


def test_rules_compile_and_lint_clean() -> None:
    assert PROBLEMS == []
    assert lint(KNOWLEDGE) == []


def test_every_rule_has_a_firing_and_a_quiet_test() -> None:
    for lr in RULES:
        assert any(t.expect for t in lr.rule.tests), lr.rule.id
        assert any(not t.expect for t in lr.rule.tests), lr.rule.id


def test_every_incident_a_rule_names_exists_and_expects_its_root_cause() -> None:
    from pathlib import Path

    from eroica.engine.evaluate import load_expected

    root = Path(__file__).parents[2] / "incidents"
    for lr in RULES:
        for inc in lr.rule.incidents:
            exp = root / inc / "expected.yaml"
            assert exp.exists(), f"{lr.rule.id}: incident {inc} not found under incidents/"
            assert lr.rule.taxonomy in {e.root_cause for e in load_expected(exp).expect}, (lr.rule.id, inc)


def test_every_taxonomy_id_has_a_rule_with_a_firing_and_a_quiet_test() -> None:
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).parents[2] / "knowledge" / "taxonomy.yaml").read_text())
    covered = {lr.rule.taxonomy for lr in RULES
               if any(t.expect for t in lr.rule.tests) and any(not t.expect for t in lr.rule.tests)}
    # a hang no rule concludes on is the taxonomy's declared fallback (tests/unit/engine/test_hang.py)
    fallback = doc["hang"]["fallback"]["root_cause"]
    assert set(doc["root_causes"]) - covered == {fallback}, "taxonomy ids without a tested rule"


def test_lint_catches_bad_given_facts_summary_fields_and_dangling_references(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    src = (Path(__file__).parents[2] / "knowledge" / "rules" / "cpu" / "contention.yaml").read_text()
    bad = (src.replace("fix_template: isolate-cpus", "fix_template: no-such-template")
              .replace("{host.other_cores:.1f}", "{host.other_core:.1f}")
              .replace("cores_total: 8, busy_cores: 7.5", "cores_totl: 8, busy_cores: \"lots\"", 1)
              .replace("incidents: [INC-0017", "incidents: [INC-9999"))
    (tmp_path / "contention.yaml").write_text(bad)
    problems = lint_paths([tmp_path])
    text = "\n".join(problems)
    assert "fact 'host_cpu' has no field 'cores_totl'" in text
    assert "host_cpu.busy_cores = 'lots' is not a valid" in text
    assert "the summary names {host.other_core}" in text
    assert "fix_template 'no-such-template' has no knowledge/remediations/no-such-template.yaml" in text
    assert "incident 'INC-9999' is not in" in text
    assert all(p.startswith(f"{tmp_path / 'contention.yaml'}:") for p in problems)


def test_lint_wants_a_quiet_test_at_each_threshold_that_differs_from_a_firing_test_only_there(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    src = (Path(__file__).parents[2] / "knowledge" / "rules" / "storage" / "slow_writes.yaml").read_text()
    start = src.index("  - name: \"quiet when function_outlier.explains_ratio is just across")
    end = src.index("    expect: []", start) + len("    expect: []\n")
    (tmp_path / "slow_writes.yaml").write_text(src[:start] + src[end:])   # that boundary's own quiet test gone
    problems = lint_paths([tmp_path])
    assert len(problems) == 1 and "threshold function_outlier.explains_ratio gte 0.3 has no quiet test" in problems[0]
