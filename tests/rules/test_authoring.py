"""Knowledge an SRE can own: what a new rule author tried and met (each case gets a clear error or
works), the one compile path every command shares, and site knowledge as layers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eroica.cli.main import main
from eroica.engine.errors import RuleError
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.rules.layers import ENV, KnowledgeSpec, load

ROOT = Path(__file__).parents[2]
INC = ROOT / "incidents" / "INC-0001"          # rank 1's loader stalls: dataloader_stall

HEAD = """schema: eroica.rule/v1
id: site.{name}
title: a site's rule
status: experimental
severity: medium
taxonomy: {cause}
owner: site-sre
"""
SLOW = "{kind: rank_slowness, rank: 1, excess_step_ratio: 0.5}"
FIRING = """when:
  - {{fact: rank_slowness, as: slow, where: {{rank: $rank, excess_step_ratio: {{gte: 0.1}}}}}}
  - {{fact: {kind}, as: x, where: {{rank: $rank, {field}: {value}}}}}
emit:
  confidence: 0.7
  summary: Rank {{slow.rank}} is slow.
tests:
  - name: fires
    given: [{slow}, {{kind: {kind}, rank: 1, {field}: {value}}}]
    expect: [{{rank: 1, root_cause: {cause}}}]
  - name: quiet when the rank costs under a tenth of a step
    given: [{{kind: rank_slowness, rank: 1, excess_step_ratio: 0.09}}, {{kind: {kind}, rank: 1, {field}: {value}}}]
    expect: []
"""


def rule(tmp: Path, name: str, kind: str, field: str, value: str, cause: str = "host_memory_pressure",
         site: bool = True) -> Path:
    d = tmp / "site" / "rules" if site else tmp / "rules"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name.replace('-', '_')}.yaml"
    p.write_text(HEAD.format(name=name, cause=cause)
                 + FIRING.format(kind=kind, field=field, value=value, cause=cause, slow=SLOW))
    return p


def test_a_rule_on_a_signal_no_collector_produces_is_refused_with_its_line_and_the_closest_names(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = rule(tmp_path, "swap-in", "hw_signal", "signal", "swap_in_pages_per_second")
    assert main(["rules", "lint", str(p)]) == 1
    out = capsys.readouterr().out
    assert f"{p}:10: rule 'site.swap-in', key 'when.1.where.signal': 'swap_in_pages_per_second' is not a hardware " \
           "signal a collector produces" in out
    assert "closest: swap_used_bytes" in out
    assert main(["rules", "test", str(p)]) == 1           # the same refusal: the engine would never run it
    assert "'swap_in_pages_per_second' is not a hardware signal" in capsys.readouterr().out


def test_a_category_that_does_not_exist_is_refused_and_the_right_one_named(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = rule(tmp_path, "loading", "function_outlier", "category", "dataloading")
    assert main(["rules", "lint", str(p)]) == 1
    assert "'dataloading' is not a category the engine states (function_outlier.category); closest: data" in \
        capsys.readouterr().out


@pytest.mark.parametrize(("kind", "field", "value", "says"), [
    ("function_outlier", "explains_ratio", "{gte: 50}", "threshold 50 is outside the range of "
                                                        "function_outlier.explains_ratio (0..1)"),
    ("hw_signal", "disk_read_bytes_per_second", "{lt: 0}", "has no field"),
    ("job_slowdown", "step_seconds", "{lt: 0}", "`lt: 0` can never hold"),
    ("rank_slowness", "least_waiting", "'yes'", "'yes' is not a bool"),
    ("hang_state", "state", "waiting", "'waiting' is not a hang state the engine states"),
])
def test_a_threshold_out_of_range_a_wrong_type_or_a_value_never_stated_is_refused(
        tmp_path: Path, kind: str, field: str, value: str, says: str) -> None:
    rule(tmp_path, "bad", kind, field, value)
    k = load(KnowledgeSpec(site_dirs=(tmp_path / "site",)), raise_problems=False)
    assert any(says in p for p in k.problems), k.problems


def test_a_signals_value_is_judged_in_that_signals_unit(tmp_path: Path) -> None:
    p = rule(tmp_path, "gpu-busy", "hw_signal", "signal", "gpu_util_ratio")
    p.write_text(p.read_text().replace("signal: gpu_util_ratio}}", "signal: gpu_util_ratio, value: {gte: 80}}}", 1))
    k = load(KnowledgeSpec(site_dirs=(tmp_path / "site",)), raise_problems=False)
    assert any("threshold 80 is outside the range of gpu_util_ratio (0..1)" in x for x in k.problems), k.problems


def test_window_and_hang_facts_in_one_rule_and_a_needs_typo_are_refused(tmp_path: Path) -> None:
    p = rule(tmp_path, "mixed", "hang_state", "state", "dead")
    p.write_text(p.read_text().replace("  summary:", "  needs: [nvlm]\n  summary:"))
    problems = "\n".join(load(KnowledgeSpec(site_dirs=(tmp_path / "site",)), raise_problems=False).problems)
    assert "a window's facts and a hang's are never stated together" in problems
    assert "'nvlm' is not a source a collector records a gap for; closest: nvml" in problems


def test_a_hypothesis_no_enabled_rule_derives_makes_its_consumers_refused(tmp_path: Path) -> None:
    """Disabling a shipped deriving rule breaks the chain: every rule consuming what it derived is named."""
    (tmp_path / "site" / "overrides").mkdir(parents=True)
    (tmp_path / "site" / "overrides" / "s.yaml").write_text(
        "overrides:\n  data.bound: {disabled: true, reason: we read from RAM disks}\n")
    with pytest.raises(RuleError) as exc:
        load(KnowledgeSpec(site_dirs=(tmp_path / "site",)))
    assert exc.value.problems == [
        f"{tmp_path / 'site' / 'overrides' / 's.yaml'}:2: override for 'data.bound': disabling 'data.bound' silences 1 "
        "rule(s) that consume the 'data_bound' it derives: straggler.dataloader-stall; disable those too (each with a "
        "reason), or keep 'data.bound' and retune it (where:)"]
    k = load(KnowledgeSpec(site_dirs=(tmp_path / "site",)), raise_problems=False)
    assert "straggler.dataloader-stall" in k.refused


def test_a_shipped_rule_tested_alone_runs_with_its_chain(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules", "test", str(ROOT / "knowledge" / "rules" / "memory" / "cgroup_limit.yaml")]) == 0
    assert "9 passed, 0 failed" in capsys.readouterr().out


def test_a_site_rule_on_a_derived_fact_passes_alone_without_knowledge(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "loader_io.yaml"
    p.write_text(HEAD.format(name="loader-io", cause="slow_storage") + """when:
  - {fact: data_bound, as: d, where: {rank: $rank, explains_ratio: {gte: 0.6}}}
emit:
  confidence: 0.7
  function: $d.top_function
  summary: Rank {d.rank} waits on its loader in {d.top_function}.
tests:
  - name: fires through the shipped chain from the measured facts
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.5, consistency_ratio: 1.0, group: w, least_waiting: true}
      - {kind: category_excess, rank: 1, category: data, explains_ratio: 0.9, top_function: DataLoader.__next__,
         seconds_per_step: 0.12, peer_median_seconds_per_step: 0.002, ratio_to_median: 60.0}
    expect: [{rank: 1, root_cause: slow_storage, function: DataLoader.__next__}]
  - name: quiet when the loader explains just under 0.6
    given:
      - {kind: rank_slowness, rank: 1, excess_step_ratio: 0.5, consistency_ratio: 1.0, group: w, least_waiting: true}
      - {kind: category_excess, rank: 1, category: data, explains_ratio: 0.59, top_function: DataLoader.__next__,
         seconds_per_step: 0.12, peer_median_seconds_per_step: 0.002, ratio_to_median: 60.0}
    expect: []
""")
    assert main(["rules", "test", str(p)]) == 0, capsys.readouterr().out
    assert "2 passed, 0 failed" in capsys.readouterr().out


def test_an_unknown_root_cause_fails_test_lint_and_diagnose_alike_with_file_and_line(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = rule(tmp_path, "mystery", "rank_slowness", "least_waiting", "true", cause="mystery_cause")
    said = f"{p}:6: rule 'site.mystery', key 'taxonomy': unknown root cause 'mystery_cause'"
    assert main(["rules", "test", str(p)]) == 1
    assert said in capsys.readouterr().out
    assert main(["rules", "lint", str(p)]) == 1
    assert said in capsys.readouterr().out
    assert main(["diagnose", str(INC), "--knowledge", str(tmp_path / "site")]) == 2
    assert said in capsys.readouterr().err


def test_an_empty_target_and_a_yml_file_are_errors(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    assert main(["rules", "test", str(tmp_path / "empty")]) == 1
    assert "holds no rule file (*.yaml); nothing to check" in capsys.readouterr().out
    yml = tmp_path / "gc.yml"
    shutil.copy(ROOT / "knowledge" / "rules" / "runtime" / "gc_pause.yaml", yml)
    assert main(["rules", "lint", str(yml)]) == 1
    assert f"{yml}: not a rule file: rule files end in .yaml; rename it" in capsys.readouterr().out
    (tmp_path / "site" / "rules").mkdir(parents=True)
    shutil.copy(yml, tmp_path / "site" / "rules" / "gc.yml")
    with pytest.raises(RuleError, match="rule files end in .yaml; rename it"):
        load(KnowledgeSpec(site_dirs=(tmp_path / "site",)))


def test_a_full_copy_of_knowledge_is_a_valid_site_and_a_site_replaces_or_disables_a_rule_with_a_reason(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    shutil.copytree(ROOT / "knowledge", site)
    assert main(["rules", "lint", "--knowledge", str(site)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    gc = site / "rules" / "runtime" / "gc_pause.yaml"
    gc.write_text(gc.read_text().replace("confidence: 0.8", "confidence: 0.6"))
    with pytest.raises(RuleError, match=r"rule id 'runtime.gc-pause' is already defined in .*; to replace it at "
                                        r"your site add `replaces: <why>`"):
        load(KnowledgeSpec(site_dirs=(site,)))
    gc.write_text(gc.read_text() + "replaces: our GC pauses are shorter\n")
    (site / "overrides").mkdir()
    (site / "overrides" / "ours.yaml").write_text("overrides:\n  cpu.contention: {disabled: true}\n")
    with pytest.raises(RuleError, match=r"ours.yaml:2: override for 'cpu.contention': an override says why"):
        load(KnowledgeSpec(site_dirs=(site,)))
    (site / "overrides" / "ours.yaml").write_text(
        "overrides:\n  cpu.contention: {disabled: true, reason: our hosts run one job each}\n")
    k = load(KnowledgeSpec(site_dirs=(site,)))
    gc_entry, cont = k.entry("runtime.gc-pause"), k.entry("cpu.contention")
    assert gc_entry is not None and gc_entry.origin == str(site) and "our GC pauses are shorter" in gc_entry.replaces
    assert gc_entry.prior.startswith("hand-set 0.6")       # a replaced rule keeps no fitted prior of the shipped one
    assert cont is not None and not cont.enabled and "our hosts run one job each" in cont.why_disabled
    assert main(["rules", "list", "--knowledge", str(site), "--format", "json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["cpu.contention"]["enabled"] is False and rows["runtime.gc-pause"]["origin"] == str(site)
    assert rows["straggler.detected"]["origin"] == "shipped"


def test_site_directories_come_from_the_environment_first_and_the_command_line_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = tmp_path / "a", tmp_path / "b"
    for d, conf in ((a, 0.3), (b, 0.4)):
        (d / "overrides").mkdir(parents=True)
        (d / "overrides" / "o.yaml").write_text(f"overrides:\n  runtime.gc-pause: {{confidence: {conf}, reason: "
                                                f"measured at {d.name}}}\n")
    monkeypatch.setenv(ENV, str(a))
    assert main(["rules", "show", "runtime.gc-pause", "--knowledge", str(b), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["prior"] == 0.4 and "measured at b" in shown["override"]


def test_rules_show_says_where_the_prior_comes_from_and_what_multiplies_it(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules", "show", "straggler.dataloader-stall", "--incidents", str(ROOT / "incidents")]) == 0
    out = capsys.readouterr().out
    assert "fitted" in out and "knowledge/priors.yaml" in out
    for label in ("x strength", "x consistency", "x peers", "x coverage"):
        assert label in out
    assert "INC-0001 (" in out and "expects dataloader_stall on rank 1" in out
    assert main(["rules", "show", "straggler.dataloader-stal"]) == 2
    assert "closest: straggler.dataloader-stall" in capsys.readouterr().err


def test_the_text_report_names_the_deciding_rule_and_its_factors(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A site rule emitting 0.7 is reported at its prior times the measured factors, and says so."""
    assert main(["diagnose", str(INC)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "confidence: prior" in x)
    assert "x strength" in line and "x peers" in line and "decided by straggler.dataloader-stall" in line
    d = diagnose(INC, DiagnoseOptions(in_process=True))
    f = d.windows[0].findings[0]
    product = 1.0
    for _, v in f.confidence_factors.terms():
        product *= v
    assert abs(product - f.confidence) < 0.006


def test_eval_and_promote_take_the_site_layers(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "site" / "overrides").mkdir(parents=True)
    (tmp_path / "site" / "overrides" / "o.yaml").write_text(
        "overrides:\n  straggler.dataloader-stall: {disabled: true, reason: a test of the layers}\n")
    lib = tmp_path / "lib"
    shutil.copytree(INC, lib / "INC-0001")
    assert main(["eval", str(lib)]) == 0
    capsys.readouterr()
    assert main(["eval", str(lib), "--knowledge", str(tmp_path / "site")]) == 1     # the library's rule is gone
    assert "FAIL INC-0001" in capsys.readouterr().out
    assert main(["rules", "promote", "--dry-run", "--incidents", str(lib), "--min-incidents", "1"]) == 1
    assert "no healthy run (expect: []) in" in capsys.readouterr().err   # nothing shows a rule stays quiet
    shutil.copytree(ROOT / "incidents" / "INC-0021", lib / "INC-0021")    # a healthy run
    assert main(["rules", "promote", "--dry-run", "--incidents", str(lib), "--min-incidents", "1"]) == 0
    assert "checked against 1 healthy run(s)" in capsys.readouterr().out    # (the walkthrough promotes a rule)
    assert main(["rules", "promote", "--dry-run", "--incidents", str(lib), "--knowledge", str(tmp_path / "site"),
                 "--min-incidents", "1"]) == 0
    assert "straggler.dataloader-stall" not in capsys.readouterr().out


def test_rules_new_scaffolds_a_rule_from_a_window_that_lints_tests_and_fires_there(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    window = ROOT / "incidents" / "INC-0014" / "patterns" / "w000-s37"
    assert main(["rules", "new", "--from", str(window), "--rank", "1", "--cause", "slow_storage",
                 "--knowledge", str(site)]) == 0
    written = Path(capsys.readouterr().out.split()[1])
    text = written.read_text()
    assert written.parent == site / "rules" and "taxonomy: slow_storage" in text
    assert "function: log_metrics" in text and "fires on rank 1 of window w000-s37" in text
    assert main(["rules", "lint", str(written), "--knowledge", str(site)]) == 0, capsys.readouterr().out
    assert main(["rules", "test", str(written), "--knowledge", str(site)]) == 0
    out = capsys.readouterr().out
    assert " 0 failed" in out and out.count("PASS") >= 3          # firing, and a quiet test per threshold
    d = diagnose(ROOT / "incidents" / "INC-0014", DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec((site,))))
    assert any("site.slow-storage-log-metrics" in f.rule_ids for f in d.windows[0].findings)
    assert main(["rules", "new", "--from", str(window), "--rank", "1", "--cause", "slow_storage",
                 "--knowledge", str(site)]) == 2                     # the id is taken now
    assert "already used" in capsys.readouterr().err
    assert main(["rules", "new", "--from", str(window), "--rank", "0", "--cause", "slowstorage",
                 "--knowledge", str(site)]) == 2
    assert "unknown root cause 'slowstorage'; closest: slow_storage" in capsys.readouterr().err
    assert main(["rules", "new", "--from", str(window), "--rank", "0", "--cause", "slow_storage",
                 "--knowledge", str(site), "--id", "site.other"]) == 2
    assert "rank 0 does not stand out in window w000-s37" in capsys.readouterr().err


def test_the_vocabulary_is_printed_for_people_and_tools(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules", "vocabulary", "--format", "json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["facts"]["function_outlier"]["fields"]["category"]["domain"] == "category"
    assert v["facts"]["function_outlier"]["fields"]["explains_ratio"]["range"] == [0.0, 1.0]
    assert "data" in v["domains"]["category"] and "swap_used_bytes" in v["domains"]["signal"]
    gpu = next(s for s in v["signals"] if s["name"] == "gpu_sm_clock_mhz")
    assert (gpu["unit"], gpu["source"], gpu["scope"]) == ("MHz", "nvml", "NVML")
    assert v["facts"]["data_bound"]["derived_by"] == ["data.bound"]
    assert v["root_causes"]["dataloader_stall"]["category"] == "software"


def test_serve_refuses_knowledge_the_engine_would_refuse_before_it_listens(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rule(tmp_path, "swap-in", "hw_signal", "signal", "swap_in_pages_per_second")
    assert main(["serve", "--data", str(tmp_path / "data"), "--port", "1", "--knowledge", str(tmp_path / "site")]) == 2
    assert "'swap_in_pages_per_second' is not a hardware signal" in capsys.readouterr().err


def test_an_override_is_checked_like_a_rule_and_named_where_it_sets_the_value(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    o = tmp_path / "site" / "overrides" / "o.yaml"
    o.parent.mkdir(parents=True)
    o.write_text("overrides:\n  data.bound:\n    reason: our loaders read from RAM\n"
                 "    where: {1: {category: dataloading}}\n")
    assert main(["rules", "lint", "--knowledge", str(tmp_path / "site")]) == 1
    out = capsys.readouterr().out
    assert f"(as overridden at {o}:4: override for 'data.bound'): 'dataloading' is not a category" in out
    o.write_text("overrides:\n  data.bound:\n    reason: our loaders read from RAM\n"
                 "    where: {1: {explains_ratio: {gte: 0.7}}}\n")
    assert main(["rules", "lint", "--knowledge", str(tmp_path / "site")]) == 0   # its tests are the shipped ones'
    capsys.readouterr()
    assert main(["rules", "test", str(ROOT / "knowledge" / "rules" / "data" / "bound.yaml"),
                 "--knowledge", str(tmp_path / "site")]) == 1
    assert "this test was written for the ones it ships with" in capsys.readouterr().out


def test_nothing_in_a_site_directory_is_silently_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "rule").mkdir(parents=True)                                  # rules/ misspelled
    (site / "overrides").mkdir()
    (site / "overrides" / "ours.yml").write_text("overrides: {}\n")
    (site / "taxonomy.yml").write_text("root_causes: {}\n")
    problems = KnowledgeSpec(site_dirs=(site,)).site_problems()
    assert f"--knowledge {site}: rule/ would never be read: did you mean rules/?" in problems
    assert f"--knowledge {site}: overrides/ours.yml would never be read: override files end in .yaml; rename it" \
        in problems
    assert f"--knowledge {site}: taxonomy.yml would never be read: rename it taxonomy.yaml" in problems
    monkeypatch.setenv(ENV, str(tmp_path / "nope"))
    assert KnowledgeSpec.of().site_problems() == [f"${ENV} {tmp_path / 'nope'}: not a directory (a site knowledge "
                                                   "directory holds rules/, overrides/*.yaml, taxonomy.yaml and/or "
                                                   "hypotheses.yaml)"]


def test_an_empty_rules_folder_a_site_passed_as_a_path_and_a_missing_runbook(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    (site / "rules").mkdir(parents=True)                                 # a new site: no rule yet
    assert load(KnowledgeSpec(site_dirs=(site,))).problems == []
    (site / "taxonomy.yaml").write_text("root_causes:\n  ours: {category: software, component: c, question: q, "
                                        "runbook: runbooks/ours.md}\n")
    assert main(["rules", "lint", "--knowledge", str(site)]) == 1
    assert f"root cause 'ours': its runbook {(site / 'runbooks' / 'ours.md').resolve()} does not exist" in \
        capsys.readouterr().out
    assert main(["rules", "lint", str(site)]) == 1
    assert f"{site}: a site knowledge directory (rules/, overrides/, taxonomy.yaml): pass it as --knowledge {site}" \
        in capsys.readouterr().out


def test_an_override_names_a_condition_by_alias_and_show_prints_the_rule_as_it_runs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    o = tmp_path / "site" / "overrides" / "o.yaml"
    o.parent.mkdir(parents=True)
    o.write_text("overrides:\n  compute.workload-imbalance:\n    reason: our stages differ by design\n"
                 "    where: {work: {excess_step_ratio: {gte: 0.25}}}\n")
    assert main(["rules", "show", "compute.workload-imbalance", "--knowledge", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert f"As it runs here (the override at {o}:3 (our stages differ by design))" in out
    assert '"excess_step_ratio": {"gte": 0.25}' in out
    o.write_text("overrides:\n  compute.workload-imbalance: {reason: r, where: {5: {a: 1}}, confidence: 1.7}\n")
    with pytest.raises(RuleError) as exc:                                # reported, never applied: no traceback
        load(KnowledgeSpec(site_dirs=(tmp_path / "site",)))
    said = "\n".join(exc.value.problems)
    assert "no condition 5; rule 'compute.workload-imbalance' has conditions 0..2 (or by alias: work, cpu, thr)" in said
    assert "confidence is a number in [0, 1], got 1.7" in said
