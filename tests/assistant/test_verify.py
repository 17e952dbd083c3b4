"""The verification's measure and verdict on recorded windows (tests/e2e/test_verify_e2e.py runs it
end to end on a real job)."""

from __future__ import annotations

import json
from pathlib import Path

from patterns_factory import make_doc, write_run

from eroica.assistant.models import Verification
from eroica.assistant.verify import (
    MAX_TOLERANCE,
    TOLERANCE,
    DetectorSteps,
    Healthy,
    Measured,
    _append,
    healthy_reference,
    judge,
    measure,
    median_error,
    median_run,
    reference_steps,
    run_spread,
    slow_from,
)
from eroica.schema.diagnosis import Diagnosis


def _run(tmp: Path, step: float, data: float, trigger: str = "forced") -> Path:
    docs = []
    for r in range(4):
        busy = {"compute:forward": 0.02, "data:DataLoader.__next__": data if r == 1 else 0.001}
        d = make_doc(r, step=step, busy=busy)
        docs.append(d.model_copy(update={"window": d.window.model_copy(update={"trigger": trigger})}))
    write_run(tmp, docs)
    (tmp / docs[0].window.window_id / "rank-0.trace.json").write_text(json.dumps({"traceEvents": []}))
    return tmp


def test_the_step_and_the_function_are_read_from_the_forced_window(tmp_path: Path) -> None:
    m = measure(_run(tmp_path, 0.16, 0.12), [1], "DataLoader.__next__")
    assert m.why is None and abs(m.step_seconds - 0.16) < 1e-9 and abs(m.function_seconds - 0.12) < 1e-9
    assert "opened no window" in (measure(tmp_path / "none", [1], None).why or "")


def _series_run(tmp: Path, series: list[float], step: float) -> Path:
    """A re-run whose forced window opened at step 50, after `series` (steps 2-49) on every rank."""
    docs = []
    for r in range(4):
        d = make_doc(r, step=step, window="w000-s50")
        docs.append(d.model_copy(update={
            "window": d.window.model_copy(update={"trigger": "forced", "start_step": 50, "end_step": 60}),
            "step_times": d.step_times.model_copy(update={"before_seconds": series})}))
    return write_run(tmp, docs)


def _diagnosis(first_window_step: int, healthy: float) -> Diagnosis:
    from eroica.engine.pipeline import DiagnoseOptions, diagnose
    d = diagnose(Path(__file__).parents[2] / "incidents" / "INC-0001" / "patterns", DiagnoseOptions(in_process=True))
    w = d.windows[0]
    w = w.model_copy(update={"start_step": first_window_step,
                             "steps": w.steps.model_copy(update={"before_median_seconds": healthy})})
    return d.model_copy(update={"windows": [w]})


DETECTOR = DetectorSteps(warmup_steps=10, baseline_steps=20, recent_steps=8, lead_steps=8)


def test_each_re_run_is_judged_against_its_own_healthy_steps(tmp_path: Path) -> None:
    # the job slowed at step 30; the diagnosed run's detector fired at 33 against steps 10-24 and its
    # window opened at 41 (healthy 60 ms then). Runs differ as a whole: the unchanged re-run ran its
    # healthy steps at 60 ms, the draft's three re-runs at 66, 60 and 70 ms, each window 4-6% above its own
    diagnosis = _diagnosis(41, 0.060)
    ref = reference_steps(diagnosis, DETECTOR)
    assert ref == range(10, 25)

    def run(name: str, healthy: float, window: float) -> Measured:
        series = [0.5] * 8 + [healthy] * 20 + [window] * 20    # steps 2-9 warm-up, 10-29 healthy, 30-49 slow
        m = measure(_series_run(tmp_path / name, series, window), [1], None, ref)
        assert m.reference_seconds == healthy and m.step_seconds == window
        return m

    before = run("before", 0.060, 0.091)
    after = median_run([run("a0", 0.066, 0.069), run("a1", 0.060, 0.063), run("a2", 0.070, 0.074)])
    h = healthy_reference(diagnosis, before, after, ref)
    assert h.paired and h.seconds == 0.066 and h.unchanged_seconds == 0.060
    assert "steps 10-24" in h.source and "60 ms on the unchanged code" in h.source
    v = judge("cmd", before, after, h, None, [1])
    # the median window, 69 ms, is 15% above the unchanged run's healthy 60 ms: judged on its own, it fails
    assert v.verified and v.healthy_from == h.source and v.step_to_healthy_ratio == 1.05, v   # the median run's 63/60
    still_slow = median_run([run("s0", 0.060, 0.075), run("s1", 0.062, 0.077), run("s2", 0.058, 0.070)])
    v = judge("cmd", before, still_slow, healthy_reference(diagnosis, before, still_slow, ref), None, [1])
    assert not v.verified and "above their own healthy steps" in (v.why or ""), v
    # a draft that slows every step, before the onset too: its windows match its healthy steps, but
    # those are 40% slower than the unchanged code's
    slower = median_run([run(f"h{i}", 0.084, 0.086) for i in range(3)])
    v = judge("cmd", before, slower, healthy_reference(diagnosis, before, slower, ref), None, [1])
    assert not v.verified and "the draft slows the healthy job" in (v.why or ""), v
    # too few reference steps: a window before the job got that far, or a short series
    assert reference_steps(_diagnosis(30, 0.060), DETECTOR) is None
    assert measure(_series_run(tmp_path / "short", [0.066] * 5, 0.07), [1], None, ref).reference_seconds is None


def _paired(unchanged: list[tuple[float, float]], draft: list[tuple[float, float]]) -> tuple[Measured, Measured]:
    """Each side's re-runs as (healthy steps, step after the onset), measured as median_run does."""
    def side(runs: list[tuple[float, float]]) -> Measured:
        return median_run([Measured(step_seconds=s, reference_seconds=h, reference_ratio=s / h,
                                    run_reference_seconds=(h,), run_ratios=(s / h,)) for h, s in runs])
    return side(unchanged), side(draft)


def _judged(unchanged: list[tuple[float, float]], draft: list[tuple[float, float]]) -> Verification:
    diagnosis = _diagnosis(41, 0.060)
    before, after = _paired(unchanged, draft)
    ref = reference_steps(diagnosis, DETECTOR)
    return judge("cmd", before, after, healthy_reference(diagnosis, before, after, ref),
                 None, [1])


def test_the_tolerance_is_measured_on_the_ratio_judged_and_never_exceeds_its_bound(tmp_path: Path) -> None:
    # one run's spread: range over median over d2 (1.693 for three runs); a median of n runs' standard error
    assert abs(run_spread((0.050, 0.055, 0.060), (0.060,)) - (0.010 / 0.055) / 1.693) < 1e-12
    assert run_spread((0.06,), ()) is None
    assert median_error(1) == 1.0 and abs(median_error(3) - 0.7236) < 1e-4 and median_error(5) < median_error(3)
    # the issue's case: three runs at 1.32 of their own healthy steps (healthy 50/58/66 ms: the runs' absolute
    # speed spreads 16%, which the ratio cancels) against an unchanged 2.0: 32% above healthy is not verified
    v = _judged([(0.050, 0.100), (0.058, 0.116), (0.066, 0.132)], [(0.050, 0.066), (0.058, 0.0766), (0.066, 0.0871)])
    assert not v.verified and v.tolerance_ratio == 0.1 and v.step_to_healthy_ratio == 1.32, v
    assert v.spread_ratio is not None and v.spread_ratio < 0.001 and "at most 10%)" in (v.why or ""), v
    # as in a CI run: the blocking call left the step, the draft's median run 11% above its own healthy
    # steps, runs that agree: refused at 10%
    v = _judged([(0.061, 0.102), (0.060, 0.100), (0.062, 0.104)], [(0.058, 0.0644), (0.0585, 0.0650), (0.0590, 0.0655)])
    assert not v.verified and v.tolerance_ratio == 0.1 and v.run_ratios == (1.1103, 1.1111, 1.1102), v
    assert v.runs == 3 and "the step within 10% of the healthy step" in v.required, v
    # ratios that spread (0.95-1.30: one run's spread 18%) widen the tolerance to 3 standard errors of a
    # median of three, but never beyond 15%: 1.12 is verified, 1.20 is not
    v = _judged([(0.060, 0.100), (0.060, 0.110), (0.060, 0.120)], [(0.060, 0.057), (0.060, 0.0672), (0.060, 0.078)])
    assert v.verified and v.tolerance_ratio == MAX_TOLERANCE and v.step_to_healthy_ratio == 1.12, v
    assert "capped at 15%" in v.required, v
    cr = tmp_path / "change_request.md"
    _append(cr, v)
    assert "Required: the step within 15%" in cr.read_text() and "0.95, 1.12, 1.30" in cr.read_text()
    v = _judged([(0.060, 0.100), (0.060, 0.110), (0.060, 0.120)], [(0.060, 0.060), (0.060, 0.072), (0.060, 0.084)])
    assert not v.verified and v.tolerance_ratio == MAX_TOLERANCE and "20% above" in (v.why or ""), v
    # a moderate spread (ratios 1.04-1.16: 6%) widens it to 14% for three runs, not at all for five
    three = _judged([(0.060, 0.105), (0.060, 0.110), (0.060, 0.117)],
                    [(0.060, 0.0624), (0.060, 0.0672), (0.060, 0.0696)])
    five = _judged([(0.060, 0.105), (0.060, 0.108), (0.060, 0.110), (0.060, 0.113), (0.060, 0.117)],
                   [(0.060, 0.0624), (0.060, 0.066), (0.060, 0.0672), (0.060, 0.0684),
                                          (0.060, 0.0696)])
    assert 0.12 < three.tolerance_ratio < 0.14 and three.verified, three
    assert TOLERANCE <= five.tolerance_ratio < three.tolerance_ratio and five.runs == 5, five
    # a draft that left a third of the slowdown is refused
    v = _judged([(0.055, 0.100), (0.064, 0.104), (0.060, 0.102)], [(0.056, 0.070), (0.064, 0.082), (0.058, 0.075)])
    assert not v.verified and "above their own healthy steps" in (v.why or ""), v
    # a 20% slowdown (1.12-1.28), the draft's runs 0.96-1.08 of healthy: runs that spread so (7%) cannot tell
    # a fixed step from it (3 standard errors of the difference: 23%)
    v = _judged([(0.055, 0.0616), (0.064, 0.0768), (0.060, 0.0768)],
                [(0.056, 0.0538), (0.064, 0.0640), (0.058, 0.0626)])
    assert not v.verified and "cannot tell a fixed step" in (v.why or "") and "20% above" in (v.why or ""), v
    assert v.unchanged_ratio == 1.2
    # a 14% slowdown, the draft's step 8% over healthy on runs that agree: within 10%, but not 3 standard
    # errors (of the assumed 5% spread) from the unchanged code's step: a draft that changed nothing reads so
    v = _judged([(0.062, 0.071), (0.062, 0.0705), (0.0625, 0.071)],
                [(0.0650, 0.0705), (0.0655, 0.071), (0.0652, 0.0705)])
    assert not v.verified and v.tolerance_ratio == 0.1 and "cannot tell a fixed step" in (v.why or ""), v
    assert "less than 15% apart" in (v.why or ""), v
    # as in a CI run on a busy host (the runs' healthy steps spread by ~15%): the unchanged code 65% over its
    # healthy steps, the draft's runs 0.88, 1.01, 1.03: verified at 10%, its healthy steps within the
    # harm bound widened by their own spread
    v = _judged([(0.058, 0.0957), (0.050, 0.0825), (0.066, 0.1089)],
                [(0.070, 0.0613), (0.0623, 0.0631), (0.055, 0.0564)])
    assert v.verified and v.tolerance_ratio == 0.1 and v.unchanged_ratio == 1.65 and v.harm_ratio > 0.4, v
    assert v.run_ratios == (0.8757, 1.0128, 1.0255), v


def test_the_step_is_judged_outside_the_profiling_windows(tmp_path: Path) -> None:
    # the draft fixed the slowdown: its steps after the onset run at the healthy 60 ms, but the forced
    # window's profiled steps cost 12% more (the profiler's per-op cost); the unchanged re-run's own
    # detector profiled steps 41-60, so its slow stretch outside windows is steps 33-40
    diagnosis = _diagnosis(41, 0.060)
    ref, slow = reference_steps(diagnosis, DETECTOR), slow_from(diagnosis, DETECTOR)
    assert slow == 33
    after = measure(_series_run(tmp_path / "after", [0.5] * 8 + [0.060] * 40, 0.0672), [1], None, ref, slow)
    assert after.step_seconds == 0.060 and after.step_from == "steps 33-49 outside windows", after
    assert measure(_series_run(tmp_path / "after", [0.5] * 8 + [0.060] * 40, 0.0672), [1], None,
                   ref).step_seconds == 0.0672                     # no firing step known: the window's own
    before_run = _series_run(tmp_path / "before", [0.5] * 8 + [0.060] * 23 + [0.090] * 17, 0.1)
    for r in range(4):                                              # its detector's window, steps 41-60
        d = make_doc(r, step=0.1, window="w000-s41")
        d = d.model_copy(update={"window": d.window.model_copy(update={"trigger": "detector", "start_step": 41,
                                                                       "end_step": 61})})
        write_run(before_run, [d])
    before = measure(before_run, [1], None, ref, slow)
    assert before.step_from == "the window" and before.step_seconds == 0.1   # 33-39: too few steps outside windows
    after = median_run([after] * 3)
    v = judge("cmd", before, after, healthy_reference(diagnosis, before, after, ref), None, [1])
    assert v.verified and v.step_to_healthy_ratio == 1.0 and v.step_from == "steps 33-49 outside windows", v


def test_a_re_run_slow_from_its_first_step_never_makes_its_slow_steps_healthy(tmp_path: Path) -> None:
    diagnosis = _diagnosis(41, 0.060)
    ref = reference_steps(diagnosis, DETECTOR)
    before = measure(_series_run(tmp_path / "before", [0.1] * 48, 0.1), [1], None, ref)      # slow throughout
    after = measure(_series_run(tmp_path / "after", [0.1] * 48, 0.1), [1], None, ref)        # a draft that did nothing
    h = healthy_reference(diagnosis, before, after, ref)
    assert before.reference_seconds == 0.1 and not h.paired
    assert h == Healthy(0.060, "the diagnosed run's steps before its slowdown")
    assert not judge("cmd", before, after, h, None, [1]).verified


def test_a_command_that_does_not_reproduce_the_slowdown_verifies_nothing() -> None:
    v = judge("cmd", Measured(step_seconds=0.064), Measured(step_seconds=0.062), 0.060, None, [1])
    assert not v.verified and "did not reproduce the slowdown" in (v.why or "") and "64 ms" in (v.why or "")


def test_a_draft_that_leaves_the_job_slow_is_not_verified() -> None:
    before, healthy = Measured(step_seconds=0.16, function_seconds=0.12), 0.06
    ok = judge("cmd", before, Measured(step_seconds=0.063, function_seconds=0.001), healthy, "DataLoader.__next__", [1])
    assert ok.verified and ok.summary == ("step 160 ms -> 63 ms; healthy 60 ms; DataLoader.__next__ 120 ms -> 1 ms "
                                          "per step on rank 1")
    slow = judge("cmd", before, Measured(step_seconds=0.09, function_seconds=0.03), healthy, "DataLoader.__next__", [1])
    assert not slow.verified and "50% above the healthy 60 ms (at most 10%)" in (slow.why or "")
    failed = judge("cmd", before, Measured(why="the run with the draft failed: exit 1: boom"), healthy, None, [1])
    assert not failed.verified and "exit 1" in (failed.why or "")
    assert not judge("cmd", before, Measured(step_seconds=0.06), None, None, [1]).verified     # no healthy step


def test_the_draft_is_judged_by_its_median_re_run_not_by_one_outlier() -> None:
    # three re-runs of one job on a shared host: one caught the host busy (75 ms against 66-67)
    runs = [Measured(step_seconds=0.075, baseline_seconds=0.074, function_seconds=0.002),
            Measured(step_seconds=0.066, baseline_seconds=0.066, function_seconds=0.0),
            Measured(step_seconds=0.067, baseline_seconds=0.065, function_seconds=0.001)]
    m = median_run(runs)
    assert (m.step_seconds, m.baseline_seconds, m.function_seconds) == (0.067, 0.066, 0.001)
    assert judge("cmd", Measured(step_seconds=0.098), m, 0.065, None, [1]).verified
    assert not judge("cmd", Measured(step_seconds=0.098), runs[0], 0.065, None, [1]).verified   # the outlier alone
    # one failed re-run is the measurement's failure, with its reason
    failed = median_run([runs[0], Measured(why="the run with the draft failed: exit 1: boom"), runs[1]])
    assert failed.why == "the run with the draft failed: exit 1: boom"


def test_the_unchanged_code_and_each_draft_are_re_run_as_many_times_as_asked_in_rounds(tmp_path: Path) -> None:
    from eroica.assistant.models import DraftOutcome
    from eroica.assistant.verify import verify_all
    from eroica.engine.pipeline import DiagnoseOptions, diagnose

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("x = 1\n")
    draft = tmp_path / "drafts" / "01"
    draft.mkdir(parents=True)
    (draft / "patch.diff").write_text("--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    outcome = DraftOutcome(finding="dataloader_stall on rank [1]", root_cause="dataloader_stall", ranks=[1],
                           kind="code", directory=str(draft), backend="offline")
    seen: list[str] = []

    def runner(command: str, cwd: Path, out: Path, timeout: float) -> str | None:
        seen.append(f"{out.name}:{(cwd / 'train.py').read_text().strip()}")
        return "exit 1: no window here"

    diagnosis = diagnose(Path(__file__).parents[2] / "incidents" / "INC-0001" / "patterns",
                         DiagnoseOptions(in_process=True))
    (done,) = verify_all(diagnosis, [outcome], repo, "python train.py", runner, 10, runs=3)
    # both sides alike, in rounds: a change in the host's load between rounds falls on both
    assert seen == ["before-run-0:x = 1", "after-run-0-0:x = 2", "before-run-1:x = 1", "after-run-0-1:x = 2",
                    "before-run-2:x = 1", "after-run-0-2:x = 2"]
    assert done.verification is not None and not done.verification.verified
    assert "failed: exit 1" in (done.verification.why or "")


def test_verify_and_link_say_what_they_need(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from eroica.cli.main import main
    from eroica.engine.pipeline import DiagnoseOptions, diagnose

    d = tmp_path / "d.json"
    d.write_text(diagnose(Path(__file__).parents[2] / "incidents" / "INC-0001" / "patterns",
                          DiagnoseOptions(in_process=True)).model_dump_json())
    assert main(["draft", str(d), "--verify", "true", "-o", str(tmp_path / "o")]) == 2
    assert "--verify needs --repo" in capsys.readouterr().out
    assert main(["draft", str(d), "--link", "http://127.0.0.1:9", "-o", str(tmp_path / "o")]) == 2
    assert "--link needs --verify" in capsys.readouterr().out


def test_a_re_run_reads_the_repositorys_big_files_from_the_original(tmp_path: Path) -> None:
    from eroica.assistant import gate
    from eroica.assistant.verify import _run

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print(open('data.bin', 'rb').read(4))\n")
    (repo / "data.bin").write_bytes(b"DATA" + b"\0" * (gate.BIG_FILE_BYTES + 1))
    seen: list[str] = []

    def runner(command: str, cwd: Path, out: Path, timeout: float) -> str | None:
        seen.append((cwd / "data.bin").read_bytes()[:4].decode())
        return None

    assert _run(runner, "python train.py", repo, tmp_path / "into", tmp_path / "run", 10) is None
    assert seen == ["DATA"]
