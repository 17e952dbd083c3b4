"""A culprit over the job's windows: chronic, intermittent, rotating, transient, new."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.job_story import story
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.schema.diagnosis import WindowDiagnosis

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def one() -> WindowDiagnosis:
    d = diagnose(ROOT / "incidents" / "INC-0001", DiagnoseOptions(in_process=True))
    (w,) = d.windows
    assert (w.findings[0].root_cause, w.findings[0].ranks) == ("dataloader_stall", [1])
    return w


def job(one: WindowDiagnosis, ranks: list[int | None], recovered: bool = False) -> list[WindowDiagnosis]:
    """A job's windows 40 steps apart, one per entry: the loader stall on that rank, or a healthy window
    (None). The job's step is 0.1 s healthy, 0.2 s while the stall lasts: from the first sighting on, unless
    `recovered` (healthy again between windows) or a healthy window came between."""
    out = []
    for i, r in enumerate(ranks):
        top = one.findings[0]
        findings = [] if r is None else [top.model_copy(update={"ranks": [r]})]
        slow = r is not None and i > 0 and ranks[i - 1] is not None and not recovered
        series = one.step_series.model_copy(update={"before_seconds": [0.2 if slow else 0.1] * 40})
        out.append(one.model_copy(update={
            "window": f"w{i:03d}-s{30 + 40 * i}", "start_step": 30 + 40 * i, "end_step": 40 + 40 * i,
            "findings": findings, "healthy": r is None, "step_series": series,
            "steps": one.steps.model_copy(update={"before_median_seconds": 0.2 if slow else 0.1})}))
    return out


@pytest.mark.parametrize("ranks, kind", [
    ([1, 1, 1], "chronic"),
    ([None, 1, 1], "chronic"),
    ([1, None, 1], "intermittent"),
    ([1, 2, 3], "rotating"),
    ([1, None, None], "transient"),
    ([None, None, 1], "new"),
])
def test_each_kind_of_culprit(one: WindowDiagnosis, ranks: list[int | None], kind: str) -> None:
    (s,) = story(job(one, ranks))
    assert s.kind == kind and s.root_cause == "dataloader_stall", s
    assert s.ranks == sorted({r for r in ranks if r is not None})
    assert s.windows_seen_total == sum(r is not None for r in ranks)
    first = next(i for i, r in enumerate(ranks) if r is not None)
    assert s.windows_since_total == len(ranks) - first
    assert [x.window for x in s.sightings] == [f"w{i:03d}-s{30 + 40 * i}" for i, r in enumerate(ranks) if r is not None]
    assert all(x.excess_seconds_per_step > 0 for x in s.sightings)      # the cost in each window it was seen
    assert s.summary.startswith("dataloader_stall ") and "cost a step" in s.summary


def test_a_cause_that_went_away_between_two_windows_is_intermittent(one: WindowDiagnosis) -> None:
    """Windows open on slowdowns, so a recurring cause is often in every window: the always-on step
    series between them says whether the job ran healthy in between."""
    (s,) = story(job(one, [1, 1], recovered=True))
    assert s.kind == "intermittent" and "healthy between" in s.summary


def test_one_window_has_no_story_and_a_window_below_the_coverage_floor_says_nothing(one: WindowDiagnosis) -> None:
    assert story(job(one, [1])) == []
    windows = job(one, [1, 1, 1])
    blind = windows[1].model_copy(update={"diagnosable": False, "not_diagnosable_reason": "2 of 4 ranks"})
    (s,) = story([windows[0], blind, windows[2]])
    assert s.kind == "chronic" and s.windows_since_total == 2         # the blind window is not a healthy one


def test_a_lead_below_the_threshold_is_no_sighting(one: WindowDiagnosis) -> None:
    windows = job(one, [1, 1, 1])
    weak = windows[1].model_copy(update={"findings": [
        windows[1].findings[0].model_copy(update={"confidence": 0.4})]})
    (s,) = story([windows[0], weak, windows[2]])
    assert s.kind == "intermittent" and s.windows_seen_total == 2


def test_the_story_is_in_every_report(one: WindowDiagnosis) -> None:
    from eroica.engine import render
    from eroica.schema.diagnosis import Diagnosis

    windows = job(one, [1, 2, 3])
    d = Diagnosis(run_dir="r", eroica_version="0", rules_loaded=1, windows=windows, story=story(windows))
    for fmt in ("text", "md", "html"):
        out = render(d, fmt)
        arrow = "1 -&gt; 2 -&gt; 3" if fmt == "html" else "1 -> 2 -> 3"
        assert "rotating" in out and arrow in out, (fmt, out[:2000])
    assert Diagnosis.model_validate_json(d.model_dump_json(by_alias=True)).story == d.story
