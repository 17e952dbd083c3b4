import json
import subprocess
import sys
from pathlib import Path

from patterns_factory import make_doc, write_run

from eroica.cli.main import main


def test_diagnose_json_to_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    docs = [make_doc(r, step=0.16) for r in range(4)]
    docs[3] = make_doc(3, step=0.16, busy={"gc:gc.collect(gen2)": 0.08, "compute:forward": 0.02})
    run = write_run(tmp_path / "run", docs)
    assert main(["diagnose", str(run), "--format", "json", "-o", str(tmp_path / "d.json")]) == 0
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["windows"][0]["findings"][0]["root_cause"] == "gc_pause"


def test_diagnose_of_a_missing_dir_exits_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["diagnose", str(tmp_path / "none")]) == 2
    assert "none: no such file or directory" in capsys.readouterr().err


def test_rules_test_and_lint_pass_on_the_shipped_rules(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules", "test"]) == 0
    out = capsys.readouterr().out
    assert "PASS  straggler.dataloader-stall" in out and " 0 failed" in out
    assert main(["rules", "lint"]) == 0


def test_rules_test_fails_on_a_wrong_expectation(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = Path(__file__).parents[2] / "knowledge" / "rules" / "runtime" / "gc_pause.yaml"
    text = src.read_text().replace("expect: [{rank: 1, root_cause: gc_pause", "expect: [{rank: 2, root_cause: gc_pause")
    (tmp_path / "gc_pause.yaml").write_text(text)
    assert main(["rules", "test", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  runtime.gc-pause: fires when GC pauses explain a third of the excess" in out


def test_rules_lint_reports_an_untested_threshold_side(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = Path(__file__).parents[2] / "knowledge" / "rules" / "runtime" / "gc_pause.yaml"
    text = src.read_text().replace("explains_ratio: 0.29", "explains_ratio: 0.31")
    (tmp_path / "gc_pause.yaml").write_text(text)
    assert main(["rules", "lint", str(tmp_path)]) == 1
    assert "category_excess.explains_ratio gte 0.3 has no test on its failing side" in capsys.readouterr().out


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "eroica"
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
    assert "diagnose" in r.stdout and "demo" in r.stdout


def test_a_site_knowledge_dir_adds_rules_and_overrides(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "overrides").mkdir(parents=True)
    (site / "overrides" / "site.yaml").write_text(
        "overrides:\n  runtime.gc-pause: {disabled: true, reason: we freeze the heap}\n")
    docs = [make_doc(r, step=0.16) for r in range(4)]
    docs[3] = make_doc(3, step=0.16, busy={"gc:gc.collect(gen2)": 0.08, "compute:forward": 0.02})
    run = write_run(tmp_path / "run", docs)
    out = tmp_path / "d.json"
    assert main(["diagnose", str(run), "--knowledge", str(site), "--format", "json", "-o", str(out)]) == 0
    causes = [f["root_cause"] for f in json.loads(out.read_text())["windows"][0]["findings"]]
    assert "gc_pause" not in causes          # the site disabled the shipped rule without editing it
    assert main(["diagnose", str(run), "--knowledge", str(tmp_path / "nope")]) == 2


def test_every_command_in_the_table_is_built_from_its_module_alone() -> None:
    """`eroica CMD` imports one module; the table is the one place a command and its help are named."""
    import argparse

    from eroica.cli.main import COMMANDS, build_parser

    for name, (_module, text) in COMMANDS.items():
        sub = next(a for a in build_parser(only=name)._actions if isinstance(a, argparse._SubParsersAction))
        assert list(sub.choices) == [name]
        assert [a.help for a in sub._choices_actions] == [text]
        assert len(sub.choices[name]._actions) > 1, name      # the module added its arguments to -h

def test_diagnose_exit_status_tells_diagnosed_nothing_yet_and_bad_input_apart(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    healthy = write_run(tmp_path / "healthy", [make_doc(r, step=0.16) for r in range(4)])
    docs = [make_doc(r, step=0.16) for r in range(4)]
    docs[3] = make_doc(3, step=0.16, busy={"gc:gc.collect(gen2)": 0.08, "compute:forward": 0.02})
    slow = write_run(tmp_path / "slow", docs)
    assert main(["diagnose", str(healthy)]) == 0 and main(["diagnose", str(slow)]) == 0      # diagnosed
    # for scripts, opt-in: 1 when a cause was found
    assert main(["diagnose", str(healthy), "--exit-code"]) == 0
    assert main(["diagnose", str(slow), "--exit-code"]) == 1
    capsys.readouterr()
    (tmp_path / "started" / "logs").mkdir(parents=True)           # a job's run directory before its first window
    assert main(["diagnose", str(tmp_path / "started")]) == 4
    assert "nothing to diagnose yet" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    assert main(["diagnose", str(tmp_path / "other")]) == 2          # not a run: bad input
    capsys.readouterr()
    # four rank files of another document type: said as what they are, not as "too few ranks"
    w = tmp_path / "wrong" / "w000-s10"
    w.mkdir(parents=True)
    for r in range(4):
        (w / f"rank-{r}.json").write_text('{"schema": "eroica.diagnosis/v1", "windows": []}')
    assert main(["diagnose", str(tmp_path / "wrong")]) == 3
    err = capsys.readouterr().err
    assert "no rank's patterns could be read" in err and "expected 'eroica.patterns/v1'" in err, err


def test_a_file_the_command_cannot_write_or_read_is_one_line_not_a_traceback(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    run = write_run(tmp_path / "run", [make_doc(r, step=0.16) for r in range(4)])
    assert main(["diagnose", str(run), "-o", str(tmp_path / "missing" / "report.md")]) == 2
    err = capsys.readouterr().err
    assert "missing/report.md" in err and "does not exist" in err and "Traceback" not in err
    bad = tmp_path / "policy.yaml"
    bad.write_text("warmup_steps: 5\nthreshold_mad: [\n")
    assert main(["policy", "show", "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: not YAML" in err, err


def test_connection_options_go_before_or_after_the_subcommand(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    for argv in (["findings", "list", "--server", "http://127.0.0.1:9", "--json"],
                 ["findings", "--server", "http://127.0.0.1:9", "list", "--format", "json"]):
        assert main(argv) == 2                          # parsed, then the connection refused (nothing listens)
        assert "http://127.0.0.1:9" in capsys.readouterr().err


def test_a_policy_variable_is_named_when_wrong_and_a_misspelt_one_is_said(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_POLICY_WINDOW_STEPS", "abc")
    assert main(["policy", "show"]) == 2
    assert "EROICA_POLICY_WINDOW_STEPS='abc'" in capsys.readouterr().err
    monkeypatch.delenv("EROICA_POLICY_WINDOW_STEPS")
    monkeypatch.setenv("EROICA_POLICY_WINDOW_STEP", "15")
    assert main(["policy", "show"]) == 0
    assert "EROICA_POLICY_WINDOW_STEP is not a policy field (did you mean EROICA_POLICY_WINDOW_STEPS?)" in \
        capsys.readouterr().err


def test_policy_show_as_json_is_a_policy_file_that_reads_back(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_POLICY_WINDOW_STEPS", "15")
    assert main(["policy", "show", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["window_steps"] == 15
    monkeypatch.delenv("EROICA_POLICY_WINDOW_STEPS")
    (tmp_path / "p.json").write_text(json.dumps(shown))
    assert main(["policy", "show", "--policy", str(tmp_path / "p.json"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == shown
