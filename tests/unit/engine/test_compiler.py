from pathlib import Path

import pytest

from eroica.engine.errors import RuleCompileError, RuleError
from eroica.engine.rules.compiler import compile_rules
from eroica.engine.rules.loader import load_rules

GOOD = """\
schema: eroica.rule/v1
id: test.slow-loader
title: t
status: experimental
severity: low
taxonomy: dataloader_stall
owner: me
when:
  - {fact: rank_slowness, as: slow, where: {rank: $rank, excess_step_ratio: {gte: 0.05}}}
  - {fact: category_excess, as: d, where: {rank: $rank, category: data}}
emit: {confidence: 0.5, summary: "rank {slow.rank}", function: $d.top_function}
tests: []
"""


def write(tmp: Path, text: str, name: str = "slow_loader.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_compiles_to_an_equality_join(tmp_path: Path) -> None:
    [ir] = compile_rules(load_rules([write(tmp_path, GOOD)]))
    assert ir.patterns[1].joins[0].alias == "slow" and ir.patterns[1].joins[0].other_field == "rank"
    assert ir.function_ref == "$d.top_function"


def test_non_equality_join_is_refused_with_the_fix(tmp_path: Path) -> None:
    bad = GOOD.replace("category: data}", "category: data, excess_seconds_per_step: {gt: $limit}}")
    with pytest.raises(RuleCompileError) as e:
        compile_rules(load_rules([write(tmp_path, bad)]))
    assert "equality-only" in str(e.value) and "slow_loader.yaml:10" in str(e.value)


def test_unknown_field_and_kind_name_the_line(tmp_path: Path) -> None:
    bad = GOOD.replace("excess_step_ratio", "excess_ratioo").replace("fact: category_excess", "fact: nope")
    with pytest.raises(RuleCompileError) as e:
        compile_rules(load_rules([write(tmp_path, bad)]))
    msg = str(e.value)
    assert "has no field 'excess_ratioo'" in msg and "unknown fact kind 'nope'" in msg
    assert ":9:" in msg and ":10:" in msg


def test_schema_errors_are_collected_with_file_line_and_key(tmp_path: Path) -> None:
    bad = GOOD.replace("status: experimental", "status: beta").replace("owner: me", "owner: me\ncolor: red")
    with pytest.raises(RuleError) as e:
        load_rules([write(tmp_path, bad)])
    assert len(e.value.problems) == 2
    assert any("slow_loader.yaml:4" in p and "'status'" in p for p in e.value.problems)
    assert any("'color'" in p and "remove it" in p for p in e.value.problems)


def test_file_name_must_match_the_id(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="file name must be the id tail"):
        load_rules([write(tmp_path, GOOD, "other.yaml")])


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match=r"slow_loader.yaml:\d+: not valid YAML"):
        load_rules([write(tmp_path, GOOD + "  - {unclosed: [\n")])


def test_overrides_tune_a_threshold_or_disable_a_rule(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD)
    [ir] = compile_rules(load_rules([p], {"test.slow-loader": {"where": {0: {"excess_step_ratio": {"gte": 0.2}}}}}))
    assert ir.patterns[0].tests[0].value == 0.2
    assert load_rules([p], {"test.slow-loader": {"disabled": True}}) == []
    with pytest.raises(RuleError, match="override for 'test.nope': no such rule"):
        load_rules([p], {"test.nope": {"disabled": True}})


def test_overrides_are_validated_like_rules_and_errors_name_the_override_file_and_line(tmp_path: Path) -> None:
    from eroica.engine.rules.loader import load_overrides

    p = write(tmp_path, GOOD)
    ov = tmp_path / "site.yaml"
    ov.write_text("""overrides:
  test.slow-loader:
    confidence: 1.5
    colour: red
    where:
      7: {excess_step_ratio: {gte: 0.2}}
      0: {excess_step_ratio: {above: 0.2}, no_such_field: 1}
  test.nope: {disabled: true}
""")
    with pytest.raises(RuleError) as e:
        load_rules([p], load_overrides([ov]))
    got = "\n".join(e.value.problems)
    for line, says in ((3, "confidence is a number in [0, 1], got 1.5"), (4, "unknown key 'colour'"),
                       (6, "no condition 7"), (7, "unknown operator 'above'"),
                       (7, "has no field 'no_such_field'"), (8, "override for 'test.nope': no such rule")):
        assert f"site.yaml:{line}: " in got and says in got, (line, says, got)
    assert "slow_loader.yaml" not in got     # the shipped rule is not blamed
