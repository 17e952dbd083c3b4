"""`eroica policy replay`: the live detector and window rules on a recorded step-time series."""

from __future__ import annotations

import random
from pathlib import Path

from eroica.cli.main import main
from eroica.collector.policy import TriggerPolicy
from eroica.collector.replay import per_hour, read_step_times, replay


def series(healthy: int = 60, slow: int = 200, factor: float = 1.5, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [0.1 * rng.lognormvariate(0, 0.03) for _ in range(healthy)] + \
           [0.1 * factor * rng.lognormvariate(0, 0.03) for _ in range(slow)]


def test_a_persisting_slowdown_reopens_up_to_rearm_windows_then_the_new_normal_does_not_refire() -> None:
    w, *again = replay(series())
    assert 60 <= w.fired_at_step <= 64 and w.start_step == w.fired_at_step + 8 and w.end_step == w.start_step + 10
    # a window buys no silence: the slowdown persists, so it is profiled again after each cooldown,
    # judged against the healthy reference, until `rearm_windows` windows; then it is the new normal
    assert len(again) == 2 and all(b.fired_at_step > a.end_step + 20 for a, b in zip([w, *again], again))
    (one,) = replay(series(), TriggerPolicy(rearm_windows=1))
    assert replay(series(slow=0)) == []                                   # healthy noise: nothing
    assert replay(series(), TriggerPolicy(enabled=False)) == []


def test_windows_are_capped_per_hour_on_the_series_clock() -> None:
    rng = random.Random(2)
    flappy = []
    for _ in range(30):                  # a slowdown that comes and goes, 30 times
        flappy += [0.1 * rng.lognormvariate(0, 0.03) for _ in range(60)] + [0.2] * 40
    many = replay(flappy, TriggerPolicy(max_windows_per_hour=100))
    capped = replay(flappy, TriggerPolicy(max_windows_per_hour=3))
    assert len(many) > 10 and len([w for w in capped if not w.quiet]) == 3
    # a window opened as the slowdown ended: the job was back at speed after it: quiet, and not counted
    assert all(w.fired_at_step % 100 == 0 for w in capped if w.quiet)
    assert len(replay(flappy, TriggerPolicy(max_windows_per_hour=3, quiet_backoff_steps=0))) == 3


def test_the_cli_reads_csv_and_policy_files_and_names_bad_input(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    csv = tmp_path / "steps.csv"
    csv.write_text("step,seconds\n" + "\n".join(f"{i},{x:.5f}" for i, x in enumerate(series())))
    assert read_step_times(csv)[:2] == [float(f"{x:.5f}") for x in series()[:2]]
    pol = tmp_path / "policy.yaml"
    pol.write_text("consecutive_breaches: 1\nthreshold_min_ratio: 1.3\n")
    assert main(["policy", "replay", str(csv), "--policy", str(pol)]) == 0
    out = capsys.readouterr().out
    assert "window 0: detector fired at step" in out and "3 window(s) over 260 steps" in out
    pol.write_text("consecutive_breaches: 0\n")
    assert main(["policy", "replay", str(csv), "--policy", str(pol)]) == 2
    assert "field consecutive_breaches" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\n0.1\nfast\n")
    assert main(["policy", "replay", str(bad)]) == 2
    assert "bad.txt:3: 'fast' is not a step time" in capsys.readouterr().err
    assert main(["policy", "show"]) == 0 and "window_steps = 10" in capsys.readouterr().out


def test_a_recorded_slowdown_that_began_during_a_cooldown_is_profiled_again() -> None:
    """Generalization case 6, on a real job's series (incident INC-0042): a small bump opens a window
    that finds nothing; rank 2's input pipeline stalls from step 50, while the detector cools down.
    A detector whose window buys silence (`rearm_windows=1`, the old behaviour) never fires again:
    its lagged reference drifted into the slowdown. Judged against the last healthy reference it does."""
    import json

    doc = json.loads((Path(__file__).parents[3] / "incidents/INC-0042/patterns/w001-s76/rank-0.json").read_text())
    series = doc["step_times"]["before_seconds"] + doc["step_times"]["during_seconds"]
    bump, *after = replay(series)
    assert bump.fired_at_step < 40
    assert after and after[0].start_step > 50 and after[0].fired_at_step <= bump.end_step + 20 + 4
    assert replay(series, TriggerPolicy(rearm_windows=1)) == [bump]


def test_a_window_on_a_periodic_slowdown_covers_a_whole_period() -> None:
    rng = random.Random(4)
    series = [0.1 * rng.lognormvariate(0, 0.03) for _ in range(200)]
    for i in range(60, 200, 14):
        series[i] = 1.2                                         # a checkpoint every 14 steps became slow
    (w, *_) = replay(series)
    assert "every 14 steps" in w.reason and w.end_step - w.start_step == 15
    assert replay(series, TriggerPolicy(max_window_steps=12))[0].end_step - w.start_step == 12


def bursty(n: int, seed: int, fault_at: int | None = None, factor: float = 1.3) -> list[float]:
    """A healthy job on a shared machine: 0.1 s steps with 3% jitter and, every 60-200 steps, a burst
    of 4-14 steps 15-40% slower (another process took the cores), then a fault from `fault_at` on."""
    rng = random.Random(seed)
    out: list[float] = []
    next_burst = rng.randint(60, 200)
    while len(out) < n:
        k = len(out)
        if k >= next_burst:
            height = rng.uniform(1.15, 1.4)
            out += [0.1 * height * rng.lognormvariate(0, 0.03) for _ in range(rng.randint(4, 14))]
            next_burst = len(out) + rng.randint(60, 200)
        else:
            out.append(0.1 * rng.lognormvariate(0, 0.03))
    out = out[:n]
    if fault_at is not None:
        out[fault_at:] = [x * factor for x in out[fault_at:]]
    return out


def test_quiet_windows_back_the_detector_off_and_leave_the_budget_to_a_later_fault() -> None:
    """An hour of a healthy job on a shared machine: its bursts open windows after which the job is
    back at speed (quiet). After the first, a firing must hold for a while (8 judged steps, then 32),
    so bursts stop opening windows; quiet windows are not counted in the hour's budget, so a 1.6x
    fault after the bursts still gets its window, as soon as with no bursts before it (it is more
    than twice as far above its reference as the bursts that passed)."""
    before, after = TriggerPolicy(quiet_backoff_steps=0), TriggerPolicy()
    healthy = [bursty(36000, seed) for seed in range(2)]       # 0.1 s steps: an hour each
    n_before = [len(replay(s, before)) for s in healthy]
    n_after = [len(replay(s, after)) for s in healthy]
    assert min(n_before) >= 6 and max(n_after) <= 2, (n_before, n_after)      # the budget, and the backoff
    assert all(w.quiet for s in healthy for w in replay(s, after))          # none of them found a slowdown
    faulty = bursty(6000, 7, fault_at=5000, factor=1.6)
    got = [w for w in replay(faulty, after) if w.fired_at_step >= 5000]
    assert got and not got[0].quiet and got[0].fired_at_step <= 5000 + 6, got[:1]
    assert not [w for w in replay(faulty, before) if w.fired_at_step >= 5000]   # before: the budget was spent
    rng = random.Random(7)
    calm = [0.1 * rng.lognormvariate(0, 0.03) * (1.6 if k >= 1000 else 1.0) for k in range(1200)]
    (first, *_) = replay(calm, after)                       # the same fault on a calm machine
    assert got[0].fired_at_step - 5000 <= first.fired_at_step - 1000 + 1, (got[0], first)


def test_recorded_healthy_jobs_open_few_windows_an_hour_and_every_extra_one_is_quiet() -> None:
    """Real series (bench/trigger.py: the demo and held-out jobs, 4 ranks on this machine's 2
    cores, eroica attached, rank 0's every step), each played end to end for an hour: without the
    backoff and the budget their noise opens windows by the hundred; with them, at most two a
    job-hour, and every window beyond a job's first found the job back at speed (quiet)."""
    raw = after = 0
    for path in sorted((Path(__file__).parents[2] / "data" / "trigger").glob("steps-*.txt")):
        series = read_step_times(path)[10:]
        raw += per_hour(series, TriggerPolicy(quiet_backoff_steps=0, max_windows_per_hour=10**6), 1.0)[0]
        first_hour, _, quiet = per_hour(series, TriggerPolicy(), 1.0)
        assert first_hour <= 2 and quiet >= first_hour - 1, (path.name, first_hour, quiet)
        after += first_hour
    assert raw >= 100 and after <= 8, (raw, after)
