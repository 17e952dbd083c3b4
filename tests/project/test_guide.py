"""docs/rule-authoring.md is executed: each walkthrough command in order (eroica's in this process, the
shell's with bash) in a fresh directory beside the incident library, each file it shows written where it
says, each quoted output checked; its vocabulary tables are the ones `eroica rules vocabulary` generates."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from eroica.cli.main import main

ROOT = Path(__file__).parents[2]
GUIDE = ROOT / "docs" / "rule-authoring.md"
STEP = re.compile(r"<!-- (walkthrough|file: (?P<path>[^ ]+)) -->\n(?:<!-- [^\n]* -->\n)?"
                  r"```(?:sh|yaml|markdown)\n(.*?)```", re.S)
VOCAB = re.compile(r"<!-- vocabulary:start -->\n(.*)<!-- vocabulary:end -->", re.S)


def steps() -> list[tuple[str, str]]:
    """("file:<path>" or "run", body) in the guide's order."""
    out = []
    for m in STEP.finditer(GUIDE.read_text()):
        out.append((f"file:{m.group('path')}" if m.group("path") else "run", m.group(3)))
    return out


def test_the_walkthrough_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "incidents").symlink_to(ROOT / "incidents")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EROICA_KNOWLEDGE", raising=False)
    ran = 0
    for kind, body in steps():
        if kind.startswith("file:"):
            path = tmp_path / kind.removeprefix("file:")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            continue
        for line in body.splitlines():
            cmd, _, expect = line.partition("# expect: ")
            cmd, expect = cmd.strip(), expect.strip()
            if not cmd or cmd.startswith("#"):
                continue
            if cmd.startswith("eroica "):
                rc = main(shlex.split(cmd)[1:])
                cap = capsys.readouterr()
                out = cap.out + cap.err
            else:
                r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=dict(os.environ))
                rc, out = r.returncode, r.stdout + r.stderr
            assert rc == 0, f"{cmd}: exit {rc}\n{out}"
            assert expect in out, f"{cmd}: expected {expect!r} in:\n{out}"
            ran += 1
    assert ran >= 10
    promoted = (tmp_path / "my-site" / "rules" / "metrics_endpoint.yaml").read_text()
    assert "status: stable" in promoted


def test_the_worked_example_is_the_reports_own_words(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The confidence lines the guide quotes for INC-0014 are the ones the report prints."""
    import tempfile

    text = GUIDE.read_text()
    quoted = [x.strip() for x in text.splitlines() if x.strip().startswith("confidence: prior")]
    assert len(quoted) == 2
    with tempfile.TemporaryDirectory() as d:
        for kind, body in steps():
            if kind.startswith("file:my-site/taxonomy") or kind.startswith("file:my-site/rules"):
                p = Path(d) / kind.removeprefix("file:")
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(body)
        assert main(["diagnose", str(ROOT / "incidents" / "INC-0014"), "--knowledge", str(Path(d) / "my-site")]) == 0
    out = capsys.readouterr().out
    for q in quoted:
        assert q in out, f"{q!r} not in the report:\n{out}"


def test_the_vocabulary_tables_are_generated(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["rules", "vocabulary", "--format", "md"]) == 0
    generated = capsys.readouterr().out
    m = VOCAB.search(GUIDE.read_text())
    assert m, "the guide's vocabulary markers are missing"
    assert m.group(1) == generated, "regenerate: eroica rules vocabulary --format md (between the markers)"
