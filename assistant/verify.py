"""Verified by re-running (`eroica draft --verify CMD`): each code draft that passed the gate is applied
to a scratch copy of the repository and the job's reproduction command runs again there, attached by
eroica with a window forced after warm-up (`runs` times: the median run's step, as re-runs of one job on a
shared host differ by 10-15%), beside as many runs of the same command on the unchanged code, in
rounds (the unchanged code, then each draft), so that both sides are measured alike.
The change request then says what the re-runs measured, e.g. "step 160 ms -> 63 ms; healthy 61 ms;
DataLoader.__next__ 121 ms -> 1 ms per step on rank 1", and a draft whose re-run does not bring the
job's step within 10% of its healthy step is "not verified", with the numbers.

Healthy is the job's own step before the slowdown. Re-runs of one job on a shared host differ by 10-15%
as a whole (docs/benchmarks.md, "Drafts verified by re-running": four processes on two cores settle
into a faster or a slower schedule per run), more than the tolerance, so a step is judged against
the healthy step of the same run where the job shows one: the reproduction runs the job's healthy
stretch before the slowdown's onset, and each re-run's steps at the positions the diagnosed run's
detector took its healthy reference from (the reference steps before the recent steps it judged when
it fired the earliest window) are that run's healthy step. The verdict is then the median over the
re-runs with the draft of each run's window step over its own healthy steps. That pairing holds only
when the re-run on the unchanged code reproduced the slowdown against its own healthy steps (a run
slow from its first step has no healthy stretch, and its slow steps must never become "healthy"); and
since a draft could slow every step alike, before the onset too, its re-runs' healthy steps must not
be slower than the unchanged code's by more than HARM (twice the tolerance: the spread between runs).
Both tolerances assume one re-run's spread of about 5% (this project's 2-core machine: a healthy job's
steps after step 34 over its steps 10-25 read 0.91-1.08 in ten runs, docs/benchmarks.md); a host that
spreads its runs more is measured, not assumed, on the quantity each check judges: the runs' ratios
(each run's step over its own healthy steps, both sides) for the tolerance and the told-apart check, the
runs' healthy steps for HARM. A median of n runs varies by about sqrt(pi / 2n) of one run's spread
(MEDIAN_ERROR, so the constants follow `--verify-runs`), and each check asks for 3 standard errors
(Z): the tolerance widens to 3 standard errors of the draft's median ratio when that is larger than 10%,
but never beyond MAX_TOLERANCE (15%): a draft never verifies above that over its healthy step, whatever
the runs spread. And the draft's step must be told apart from the unchanged code's (paired): their
median ratios must differ by 3 standard errors of that difference (one run's spread at least the assumed
5%), else the re-runs cannot tell a fixed step from a slow one and the draft is not verified (a 14%
slowdown judged at 10% once verified a draft whose step was the unchanged code's). `verification.json`
and the change request say what was required (`required`).
The step those are judged on is every rank's steps from the step the diagnosed run's detector fired at
up to the re-run's forced window, less any step a window profiled: a window's steps carry the
profiler's cost (per op, so most on a model of many small ops and a slow host: docs/benchmarks.md) and
the healthy steps do not; the window's own steps only when fewer than 8 such steps were recorded.
Else healthy is the diagnosed run's history (the earliest window's `steps.before_median_seconds`),
else the unchanged re-run's detector baseline, and a draft is not verified when the unchanged re-run
was not slow against it (the command did not reproduce the slowdown: the re-run with the draft shows
nothing). The command is the user's own job, run as given (not sandboxed, unlike the gate's
validation): only what `--verify` names runs, in a scratch copy, bounded in time.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eroica.assistant.gate import scratch_copy
from eroica.assistant.models import DraftOutcome, Verification
from eroica.engine import merged_key
from eroica.schema.diagnosis import Diagnosis, Finding, WindowDiagnosis
from eroica.schema.files import RANK_FILE
from eroica.schema.patterns import PatternsDoc

TOLERANCE = 0.10            # within 10% of the healthy step: the slowdown is gone (at least; see spread)
MAX_TOLERANCE = 0.15        # and never more than 15% over it, however widely the re-runs spread
MIN_REFERENCE_STEPS = 8     # the fewest steps a healthy reference is taken from (the detector's own minimum)
HARM = 2 * TOLERANCE        # a draft's healthy steps this much slower than the unchanged code's: it slows the job
#: the mean range of n normal samples in standard deviations (d2 of quality control): a side's n re-runs'
#: healthy steps, range over median, divided by it, estimate one run's spread
RANGE_TO_SIGMA = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}
Z = 3.0                     # standard errors a check asks for
ASSUMED_SPREAD = TOLERANCE / 2  # one re-run's spread the fixed tolerances assume (a quiet 2-core host's)
#: runs `command` in `cwd`, attached, its windows written under `out`, for at most `timeout` seconds;
#: returns why it failed (None when it exited 0)
Runner = Callable[[str, Path, Path, float], "str | None"]


@dataclass(frozen=True)
class Measured:
    step_seconds: float | None = None         # median of every rank's steps in the window
    baseline_seconds: float | None = None     # the detector's baseline before the window (rank median)
    function_seconds: float | None = None     # the function on the given ranks, critical seconds per step
    reference_seconds: float | None = None    # median of every rank's steps at the reference positions
    reference_ratio: float | None = None      # step_seconds / reference_seconds, of one run
    step_from: str = "the window"             # which steps step_seconds is the median of
    why: str | None = None
    run_reference_seconds: tuple[float, ...] = ()  # each run's reference_seconds (one, or median_run's runs)
    run_ratios: tuple[float, ...] = ()             # each run's reference_ratio


@dataclass(frozen=True)
class DetectorSteps:
    """The step-time detector's step counts the re-runs run with (the collector's policy, from the
    environment the re-runs inherit; the CLI reads it)."""
    warmup_steps: int
    baseline_steps: int
    recent_steps: int
    lead_steps: int          # from the detector's firing to the window's first step


def reference_steps(diagnosis: Diagnosis, policy: DetectorSteps) -> range | None:
    """The step numbers the diagnosed run's detector took its healthy reference from when it fired the
    earliest window (the one `healthy_step` reads), `lead_steps` before the window's first step: the
    `baseline_steps` before the `recent_steps` it judged (where the slowdown began), none of them
    warm-up. None when fewer than 8 such steps exist."""
    first = _earliest_with_history(diagnosis)
    if first is None:
        return None
    hi = first.start_step - policy.lead_steps - policy.recent_steps
    lo = max(policy.warmup_steps, hi - policy.baseline_steps)
    return range(lo, hi) if hi - lo >= MIN_REFERENCE_STEPS else None


def slow_from(diagnosis: Diagnosis, policy: DetectorSteps) -> int | None:
    """The step the diagnosed run's detector fired at for its earliest window (`lead_steps` before the
    window's first step): every step from it on came after the slowdown's onset."""
    first = _earliest_with_history(diagnosis)
    return first.start_step - policy.lead_steps if first is not None else None


def measure(run_dir: Path, ranks: list[int], function: str | None, reference: range | None = None,
            slow_from_step: int | None = None) -> Measured:
    """The job's step: every rank's steps from `slow_from_step` up to the run's forced window (else its last
    window) outside every window of the run, else the window's; `function`'s time per step on `ranks` in
    that window (the largest of them); and the job's step at the `reference` step numbers (the window's
    series before it: every rank's, pooled)."""
    windows = sorted(p for p in run_dir.glob("w*") if p.is_dir() and _rank_files(p))
    if not windows:
        return Measured(why=f"the re-run opened no window in {run_dir} (was --verify-window-step within its steps?)")
    docs = [[PatternsDoc.model_validate_json(f.read_bytes()) for f in _rank_files(w)] for w in windows]
    chosen = next((ds for ds in docs if ds and ds[0].window.trigger == "forced"), docs[-1])
    # every rank's steps pooled, as the diagnosis' "step time in window" and the healthy step (the
    # ranks' baselines) are: the slowest rank's step per step would be biased up by each step's jitter
    # (four ranks on a noisy host: ~10%) against a healthy reference that is not
    steps = [x for d in chosen for x in d.step_times.during_seconds]
    if not steps:
        return Measured(why="the re-run's window holds no complete step")
    baselines = [d.step_times.baseline_median_seconds for d in chosen if d.step_times.baseline_median_seconds]
    fn = None
    if function:
        # under the key the diagnosis compares it by (GC generations are one function: gc.collect)
        per_rank = [sum(f.critical_seconds for f in d.functions if merged_key(f.category, f.name)[1] == function)
                    / max(len(d.step_times.during_seconds), 1) for d in chosen if d.job.rank in ranks]
        fn = max(per_rank) if per_rank else None
    ref = _median_at(chosen, reference, set())
    # the step from the onset on, outside every window of the run: a window's steps carry the profiler's
    # cost (per op, so most on a model of many small ops) and the healthy steps do not
    slow = range(slow_from_step, chosen[0].window.start_step) if slow_from_step is not None else None
    profiled = {s for ds in docs if ds for s in range(ds[0].window.start_step - 1, ds[0].window.end_step + 1)}
    unprofiled = _median_at(chosen, slow, profiled)
    step = unprofiled if unprofiled is not None else statistics.median(steps)
    return Measured(step_seconds=step, baseline_seconds=statistics.median(baselines) if baselines else None,
                    function_seconds=fn, reference_seconds=ref, reference_ratio=step / ref if ref else None,
                    run_reference_seconds=(ref,) if ref else (), run_ratios=(step / ref,) if ref else (),
                    step_from=f"steps {slow.start}-{slow.stop - 1} outside windows" if unprofiled is not None and slow
                    else "the window")


def _median_at(docs: list[PatternsDoc], positions: range | None, skip: set[int]) -> float | None:
    """The median of every rank's steps (the window's series before it) at the step numbers `positions`
    less `skip`; None when fewer than MIN_REFERENCE_STEPS of those steps were recorded."""
    if positions is None:
        return None
    at: dict[int, list[float]] = {}
    for d in docs:
        first = d.window.start_step - len(d.step_times.before_seconds)
        for i, x in enumerate(d.step_times.before_seconds):
            if first + i in positions and first + i not in skip:
                at.setdefault(first + i, []).append(x)
    return statistics.median(x for xs in at.values() for x in xs) if len(at) >= MIN_REFERENCE_STEPS else None


def median_run(runs: list[Measured]) -> Measured:
    """Several re-runs of one command as one measurement: the median of each number over the runs (a
    run that failed or measured nothing makes the whole measurement say why)."""
    failed = next((m for m in runs if m.why is not None or m.step_seconds is None), None)
    if failed is not None or not runs:
        return failed or Measured(why="no re-run")

    def mid(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None
    return Measured(step_seconds=mid([m.step_seconds for m in runs]),
                    baseline_seconds=mid([m.baseline_seconds for m in runs]),
                    function_seconds=mid([m.function_seconds for m in runs]),
                    reference_seconds=mid([m.reference_seconds for m in runs]),
                    reference_ratio=mid([m.reference_ratio for m in runs]),
                    step_from=" / ".join(dict.fromkeys(m.step_from for m in runs)),
                    run_reference_seconds=tuple(x for m in runs for x in m.run_reference_seconds),
                    run_ratios=tuple(x for m in runs for x in m.run_ratios))


def run_spread(*sides: tuple[float, ...]) -> float | None:
    """One re-run's spread (a relative standard deviation) measured from the re-runs themselves: each side's
    runs' healthy steps (the same code before the onset, run alike) ranged, over their median, divided by
    the mean range of that many normal samples, averaged over the sides that have two runs or more; None
    when none has."""
    est = [(max(xs) - min(xs)) / statistics.median(xs) / RANGE_TO_SIGMA[min(len(xs), 10)]
           for xs in sides if len(xs) >= 2]
    return statistics.fmean(est) if est else None


def median_error(runs: int) -> float:
    """The standard error of a median of `runs` runs, in one run's spread (sqrt(pi / 2n), the large-sample
    form, a little above the exact small-sample values: 0.72 for three runs against 0.67)."""
    return 1.0 if runs <= 2 else math.sqrt(math.pi / (2 * runs))


def _rank_files(wdir: Path) -> list[Path]:
    return sorted(f for f in wdir.glob("rank-*.json") if RANK_FILE.match(f.name))


def _ms(x: float | None) -> str:
    return "?" if x is None else f"{x * 1000:.0f} ms"


@dataclass(frozen=True)
class Healthy:
    seconds: float | None
    source: str                               # where it was measured, said in the change request
    paired: bool = False                      # each re-run judged against its own healthy steps
    unchanged_seconds: float | None = None    # paired: the unchanged code's healthy steps (the HARM check)
    spread_ratio: float | None = None         # paired: one re-run's spread of its step/healthy ratio (run_spread)
    healthy_spread_ratio: float | None = None  # paired: one re-run's spread of its healthy steps (the HARM check)
    runs: int = 1                             # paired: the re-runs per side
    slowdown_ratio: float | None = None       # paired: the unchanged code's step over its own healthy steps


def healthy_reference(diagnosis: Diagnosis, before: Measured, after: Measured, reference: range | None) -> Healthy:
    """The healthy step the re-runs are judged against (the module's docstring says which, and why)."""
    then = healthy_step(diagnosis)
    if reference is not None and before.reference_seconds and before.step_seconds \
            and before.step_seconds > before.reference_seconds * (1 + TOLERANCE) \
            and after.reference_seconds and after.reference_ratio is not None:
        return Healthy(after.reference_seconds,
                       f"each re-run's own steps {reference.start}-{reference.stop - 1}, before the slowdown's onset "
                       f"({_ms(before.reference_seconds)} on the unchanged code; {_ms(then)} in the diagnosed run)",
                       paired=True, unchanged_seconds=before.reference_seconds,
                       spread_ratio=run_spread(before.run_ratios, after.run_ratios),
                       healthy_spread_ratio=run_spread(before.run_reference_seconds, after.run_reference_seconds),
                       runs=max(1, len(after.run_ratios)), slowdown_ratio=before.reference_ratio)
    if then is not None:
        return Healthy(then, "the diagnosed run's steps before its slowdown")
    return Healthy(before.baseline_seconds, "the baseline of the re-run on the unchanged code")


def judge(command: str, before: Measured, after: Measured, healthy: float | Healthy | None, function: str | None,
          ranks: list[int]) -> Verification:
    """The verdict: verified when the re-run on the unchanged code was slow and the re-runs with the draft
    hold the step within TOLERANCE of healthy (paired: of each run's own healthy steps, within twice the
    re-runs' measured spread where that is larger, and 3 spreads apart from the unchanged code's step)."""
    ref = healthy if isinstance(healthy, Healthy) else Healthy(healthy, "given")
    summary = f"step {_ms(before.step_seconds)} -> {_ms(after.step_seconds)}; healthy {_ms(ref.seconds)}"
    if function and (before.function_seconds or after.function_seconds):   # a setting's key is no function
        summary += (f"; {function} {_ms(before.function_seconds)} -> {_ms(after.function_seconds)} per step on "
                    f"rank {', '.join(map(str, ranks))}")
    why = after.why or before.why
    ratio = after.reference_ratio if ref.paired else \
        after.step_seconds / ref.seconds if after.step_seconds is not None and ref.seconds else None
    # paired, the re-runs' own spread widens the tolerances when it is larger than they assume (never beyond
    # MAX_TOLERANCE); each on the quantity it judges, in standard errors of a median of that many runs
    spread = ref.spread_ratio if ref.paired else None
    se = median_error(ref.runs)
    tol = min(MAX_TOLERANCE, max(TOLERANCE, Z * se * spread)) if spread else TOLERANCE
    harm = max(HARM, Z * math.sqrt(2) * se * ref.healthy_spread_ratio) if ref.healthy_spread_ratio else HARM
    at_least = max(spread or 0.0, ASSUMED_SPREAD)
    apart = Z * math.sqrt(2) * se * at_least
    widened = (f" ({Z:g} standard errors of a median of {ref.runs} runs' ratios spread by {spread:.1%}"
               + (f", capped at {MAX_TOLERANCE:.0%}" if tol == MAX_TOLERANCE else "") + ")"
               if spread and tol > TOLERANCE else "")
    required = (f"the step within {tol:.0%} of the healthy step{widened}"
                + (f"; the median of {ref.runs} runs' step over their own healthy steps {apart:.0%} (3 standard "
                   f"errors of the difference) below the unchanged code's; their healthy steps at most {harm:.0%} "
                   "slower than the unchanged code's" if ref.paired else "; the re-run on the unchanged code slow "
                   f"against it by more than {TOLERANCE:.0%}"))
    if why is None and ref.seconds is None:
        why = "no healthy step to compare with (the diagnosis' window has no history, the re-run no baseline)"
    if why is None and not ref.paired and before.step_seconds is not None and ref.seconds is not None \
            and before.step_seconds <= ref.seconds * (1 + TOLERANCE):
        why = (f"the re-run on the unchanged code was not slow ({_ms(before.step_seconds)} against a healthy "
               f"{_ms(ref.seconds)}, {ref.source}): the command did not reproduce the slowdown, or the healthy step "
               "is a slow one (a window whose history already held the slowdown: draft from the earliest), so the "
               "re-run with the draft shows nothing")
    if why is None and ratio is not None and ratio > 1 + tol and ref.paired:
        why = (f"the re-runs with the draft ran {ratio - 1:.0%} above their own healthy steps (the median "
               f"run; {_ms(after.step_seconds)} against {_ms(ref.seconds)} over all of them; "
               f"at most {tol:.0%}{widened})")
    elif why is None and ratio is not None and ratio > 1 + tol:
        why = (f"the step with the draft, {_ms(after.step_seconds)}, is {ratio - 1:.0%} above the healthy "
               f"{_ms(ref.seconds)} (at most {tol:.0%})")
    # paired, the draft's step must be told apart from the unchanged code's, each over its own healthy steps
    if why is None and ratio is not None and ref.slowdown_ratio is not None and ref.slowdown_ratio - ratio < apart:
        why = (f"the re-runs cannot tell a fixed step from a slow one: the unchanged code ran "
               f"{ref.slowdown_ratio - 1:.0%} above its own healthy steps and the draft {ratio - 1:.0%}, less than "
               f"{apart:.0%} apart ({Z:g} standard errors of the difference of two medians of {ref.runs} runs spread "
               f"by {at_least:.1%}); re-run with more --verify-runs on a quieter host, or reproduce a stronger "
               "slowdown")
    if why is None and ref.paired and ref.seconds is not None and ref.unchanged_seconds \
            and ref.seconds > ref.unchanged_seconds * (1 + harm):
        why = (f"with the draft the steps before the slowdown's onset ran {ref.seconds / ref.unchanged_seconds - 1:.0%}"
               f" slower than on the unchanged code ({_ms(ref.seconds)} against {_ms(ref.unchanged_seconds)}; at most "
               f"{harm:.0%}, the spread between runs): the draft slows the healthy job")
    return Verification(
        verified=why is None, command=command, summary=summary, why=why,
        before_step_seconds=before.step_seconds, after_step_seconds=after.step_seconds,
        healthy_step_seconds=ref.seconds, healthy_from=ref.source, step_from=after.step_from,
        step_to_healthy_ratio=None if ratio is None else round(ratio, 4),
        function=function, before_function_seconds=before.function_seconds,
        after_function_seconds=after.function_seconds, tolerance_ratio=round(tol, 4), harm_ratio=round(harm, 4),
        spread_ratio=None if spread is None else round(spread, 4), runs=ref.runs, required=required,
        unchanged_ratio=None if ref.slowdown_ratio is None else round(ref.slowdown_ratio, 4),
        run_ratios=tuple(round(r, 4) for r in after.run_ratios) if ref.paired else ())


def _finding(diagnosis: Diagnosis, o: DraftOutcome) -> Finding | None:
    """The outcome's finding in the window it was drafted from."""
    for w in diagnosis.windows:
        if o.windows and w.window != o.windows[0]:
            continue
        for f in w.findings:
            if f.root_cause == o.root_cause and list(f.ranks) == o.ranks:
                return f
    return None


def _earliest_with_history(diagnosis: Diagnosis) -> WindowDiagnosis | None:
    """The run's earliest window that has a history (a later window's history already holds the slow steps)."""
    return next((w for w in sorted(diagnosis.windows, key=lambda w: w.start_step) if w.steps.before_median_seconds),
                None)


def healthy_step(diagnosis: Diagnosis) -> float | None:
    """The job's step before its slowdown: the history of the run's earliest window that has one."""
    first = _earliest_with_history(diagnosis)
    return first.steps.before_median_seconds if first is not None else None


def verify_all(diagnosis: Diagnosis, outcomes: list[DraftOutcome], repo: Path, command: str, runner: Runner,
               timeout: float, progress: Callable[[str], None] = lambda _s: None, runs: int = 3,
               detector: DetectorSteps | None = None) -> list[DraftOutcome]:
    """Re-run `command` `runs` times on the unchanged repository and as many with each distinct code draft
    applied, in rounds; each code outcome gets its Verification (also `verification.json` and a section of
    its change request)."""
    code = [o for o in outcomes if o.kind == "code" and (Path(o.directory) / "patch.diff").exists()]
    if not code:
        return outcomes
    out: dict[int, DraftOutcome] = {}
    reference = reference_steps(diagnosis, detector) if detector is not None else None
    slow = slow_from(diagnosis, detector) if detector is not None else None
    diff_of = {id(o): (Path(o.directory) / "patch.diff").read_text() for o in code}
    first: dict[str, DraftOutcome] = {}           # each distinct diff, by the first outcome that drafted it
    for o in code:
        first.setdefault(diff_of[id(o)], o)
    with tempfile.TemporaryDirectory(prefix="eroica-verify-") as tmp:
        base = Path(tmp)
        # both sides measured alike, in rounds: the unchanged code, then each distinct draft, `runs` times,
        # so a change in the host's load between rounds falls on both (one unchanged run against the
        # median of the draft's let a single run's fast schedule read as the draft's harm)
        before_runs: list[tuple[Path, str | None]] = []
        after_runs: dict[str, list[tuple[Path, str | None]]] = {d: [] for d in first}
        for i in range(runs):
            progress(f"re-running `{command}` on the unchanged code ({i + 1} of {runs})")
            run_dir = base / f"before-run-{i}"
            before_runs.append((run_dir, _run(runner, command, repo, base / f"before-{i}", run_dir, timeout)))
            for k, (diff, o) in enumerate(first.items()):
                progress(f"re-running `{command}` with the draft for {o.finding} applied ({i + 1} of {runs})")
                run_dir = base / f"after-run-{k}-{i}"
                after_runs[diff].append((run_dir, _run(runner, command, repo, base / f"after-{k}-{i}", run_dir,
                                                       timeout, Path(o.directory) / "patch.diff")))
        for o in code:
            f = _finding(diagnosis, o)
            function = f.function if f is not None else None
            before = median_run([Measured(why=f"the run on the unchanged code failed: {failed}") if failed
                                 else measure(run_dir, o.ranks, function, reference, slow)
                                 for run_dir, failed in before_runs])
            after = median_run([Measured(why=f"the run with the draft failed: {failed_after}") if failed_after
                                else measure(run_dir, o.ranks, function, reference, slow)
                                for run_dir, failed_after in after_runs[diff_of[id(o)]]])
            v = judge(command, before, after, healthy_reference(diagnosis, before, after, reference), function,
                      o.ranks)
            (Path(o.directory) / "verification.json").write_text(v.model_dump_json(indent=2) + "\n")
            _append(Path(o.directory) / "change_request.md", v)
            out[id(o)] = o.model_copy(update={"verification": v})
    return [out.get(id(o), o) for o in outcomes]


def _run(runner: Runner, command: str, repo: Path, into: Path, run_dir: Path, timeout: float,
         patch: Path | None = None) -> str | None:
    into.mkdir(parents=True)
    work, big = scratch_copy(repo, into)
    for rel, original in big.items():      # files too big to copy: the job reads the originals (no sandbox here)
        (work / rel).unlink()
        (work / rel).symlink_to(original)
    if patch is not None:
        res = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch.resolve())], cwd=work,
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            return f"the draft does not apply: {res.stderr.strip()[:200]}"
    return runner(command, work, run_dir, timeout)


def _append(change_request: Path, v: Verification) -> None:
    verdict = "**Verified by re-running the job.**" if v.verified else "**Not verified.**"
    lines = ["", "## Verified by re-running", "", f"{verdict} `{v.command}` ran on the unchanged code and with this "
             "change applied, each in a scratch copy, attached by eroica.", "", f"- Measured: {v.summary}."]
    if v.why:
        lines.append(f"- Why not verified: {v.why}.")
    else:
        lines.append(f"- The step with the change is within {v.tolerance_ratio:.0%} of the healthy step.")
    if v.required:
        lines.append(f"- Required: {v.required}.")
    if v.run_ratios:
        lines.append("- Each re-run with the change, its step over its own healthy steps: "
                     + ", ".join(f"{r:.2f}" for r in v.run_ratios)
                     + (f" (the unchanged code's median run: {v.unchanged_ratio:.2f})." if v.unchanged_ratio else "."))
    lines.append(f"- Healthy: {v.healthy_from}.")
    if v.step_from:
        lines.append(f"- Step: the re-runs' {v.step_from} (a profiling window's steps carry the profiler's cost).")
    lines.append("- The numbers: `verification.json` beside this file.")
    text = change_request.read_text() if change_request.exists() else ""
    change_request.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


def link_verified(outcomes: list[DraftOutcome], service: str, job: str, token: str | None,
                  who: str = "eroica draft --verify") -> list[str]:
    """Link each verified change request to its finding's issue in the service (`eroica serve`): the
    job's open issue of the same root cause and ranks moves to `linked`, kind change_request, its
    history saying what the re-run measured. Returns one line per outcome: linked, or why not."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}

    def call(path: str, body: dict[str, object] | None = None) -> object:
        req = urllib.request.Request(service.rstrip("/") + path, headers=headers, method="POST" if body else "GET",
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    said = []
    try:
        found = call(f"/v1/issues?job={urllib.parse.quote(job)}")
    except (OSError, ValueError) as exc:
        return [f"no link: the service at {service} did not answer GET /v1/issues: {exc}"]
    open_issues = [i for i in found if isinstance(i, dict) and i.get("state") in ("open", "acknowledged", "linked")] \
        if isinstance(found, list) else []
    for o in outcomes:
        v = o.verification
        if v is None:
            continue
        if not v.verified:
            said.append(f"{o.finding}: not linked (not verified: {v.why})")
            continue
        ranks = ",".join(map(str, o.ranks))
        issue = next((i for i in open_issues if i["root_cause"] == o.root_cause and i["ranks"] == ranks), None)
        if issue is None:
            said.append(f"{o.finding}: not linked (job {job} has no open {o.root_cause} issue on ranks {ranks})")
            continue
        url = str((Path(o.directory) / "change_request.md").resolve())
        try:
            call(f"/v1/issues/{issue['id']}/link", {"who": who, "url": url, "kind": "change_request",
                                                    "why": f"verified by re-running: {v.summary}"})
        except urllib.error.HTTPError as exc:
            said.append(f"{o.finding}: not linked (HTTP {exc.code}: {exc.read()[:200]!r})")
            continue
        except OSError as exc:
            said.append(f"{o.finding}: not linked ({exc})")
            continue
        said.append(f"{o.finding}: linked to issue {issue['id']} of job {job}")
    return said
