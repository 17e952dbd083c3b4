"""Honest verdicts: "healthy" needs evidence, and a user can point eroica at what they have."""

from __future__ import annotations

import shutil
from pathlib import Path

from patterns_factory import make_doc, write_run

from eroica.cli.main import main
from eroica.engine.pipeline import DiagnoseOptions, diagnose

ROOT = Path(__file__).parents[2]
OPTS = DiagnoseOptions(in_process=True)


def test_a_window_no_rank_could_be_read_is_not_diagnosable_and_the_exit_code_says_so(tmp_path: Path,
                                                                                      capsys) -> None:  # type: ignore[no-untyped-def]
    run = write_run(tmp_path, [make_doc(r) for r in range(4)])
    for f in (run / "w000-s30").iterdir():
        f.write_text(f.read_text()[:100])                                 # every file truncated
    (w,) = diagnose(run, OPTS).windows
    assert not w.diagnosable and not w.healthy and "no rank" in (w.not_diagnosable_reason or "")
    assert main(["diagnose", str(run)]) == 3
    out = capsys.readouterr().out
    assert "NOT DIAGNOSABLE" in out and "steps unknown" in out and "healthy" not in out


def test_below_the_coverage_floor_there_is_no_verdict_but_the_leads_stay(tmp_path: Path) -> None:
    docs = [make_doc(r, world=8) for r in range(3)]
    (w,) = diagnose(write_run(tmp_path / "few", docs), OPTS).windows
    assert not w.diagnosable and "3 of 8 ranks" in (w.not_diagnosable_reason or "") and not w.healthy
    (w,) = diagnose(write_run(tmp_path / "enough", [make_doc(r, world=8) for r in range(6)]), OPTS).windows
    assert w.diagnosable and w.healthy
    # a job of two ranks has no more to report: judged (by the expected ranges), not refused
    (w,) = diagnose(write_run(tmp_path / "two", [make_doc(r, world=2) for r in range(2)]), OPTS).windows
    assert w.diagnosable


def test_an_incident_a_window_directory_and_a_pattern_file_are_accepted(tmp_path: Path) -> None:
    inc = ROOT / "incidents" / "INC-0001"
    whole = diagnose(inc, OPTS).windows
    assert [w.window for w in whole] == ["w000-s31"] and whole[0].findings[0].root_cause == "dataloader_stall"
    window = inc / "patterns" / "w000-s31"
    assert diagnose(window, OPTS).windows[0].findings[0].ranks == [1]
    assert diagnose(window / "rank-0.json", OPTS).windows[0].coverage.ranks_reported == [0, 1, 2, 3]
    shutil.copytree(inc, tmp_path / "INC-9999")
    assert main(["diagnose", str(tmp_path / "INC-9999"), "--format", "json", "-o", str(tmp_path / "d.json")]) == 0
