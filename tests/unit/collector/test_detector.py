import random

from eroica.collector.detector import StepTimeDetector, trimmed_mean
from eroica.collector.policy import TriggerPolicy


def feed(det: StepTimeDetector, times: list[float], start: int = 0) -> list[int]:
    return [start + i for i, t in enumerate(times) if det.observe(start + i, t).fire]


def policy(**kw: object) -> TriggerPolicy:
    base: dict[str, object] = dict(warmup_steps=2, baseline_steps=8, recent_steps=4, consecutive_breaches=3,
                                   cooldown_steps=10, lead_steps=7)
    base.update(kw)
    return TriggerPolicy(**base)


def noisy(n: int, mean: float = 0.1, rel: float = 0.1, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def test_nothing_is_judged_during_warmup_or_before_a_reference_exists() -> None:
    det = StepTimeDetector(policy())
    assert feed(det, [5.0, 5.0] + [0.1] * 11) == []          # warm-up spikes never count
    assert det.baseline_median_seconds is None                # 11 judged steps < 8 reference + 4 recent
    feed(det, [0.1], start=13)
    assert det.baseline_median_seconds == 0.1


def test_fast_test_fires_after_k_consecutive_breaches_not_before() -> None:
    det = StepTimeDetector(policy(sustained_min_ratio=50.0))
    fired = feed(det, [0.1] * 14 + [0.3] * 4)
    assert fired and fired[0] == 16                           # the third breach in a row


def test_two_breaches_then_recovery_do_not_fire() -> None:
    det = StepTimeDetector(policy(sustained_min_ratio=50.0))
    assert feed(det, [0.1] * 14 + [0.3, 0.3, 0.1, 0.3, 0.3, 0.1]) == []


def test_threshold_has_a_floor_ratio_over_a_tiny_mad() -> None:
    det = StepTimeDetector(policy())
    feed(det, [0.1] * 14)
    assert det.threshold_seconds() == 0.1 * 1.15
    assert not det.observe(14, 0.114).breach
    assert det.observe(15, 0.116).breach


def test_sustained_test_finds_a_modest_slowdown_no_single_step_shows() -> None:
    base = noisy(30, rel=0.15)
    det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
    assert feed(det, base) == []
    slow = [x * 1.2 for x in noisy(12, rel=0.15, seed=1)]
    fired = feed(det, slow, start=30)
    assert fired and fired[0] <= 30 + 8


def test_healthy_noise_with_hiccups_does_not_fire() -> None:
    for seed in range(20):
        det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
        times = noisy(200, rel=0.1, seed=seed)
        for i in range(7, 200, 23):
            times[i] *= 3                                      # a lone hiccup now and then
        assert feed(det, times) == [], seed


def test_intermittent_slow_steps_fire_the_sustained_test() -> None:
    det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
    feed(det, noisy(30, rel=0.1))
    steps = [0.2 if i % 3 == 0 else 0.1 for i in range(12)]   # every third step is 2x
    assert feed(det, steps, start=30)


def test_one_hiccup_does_not_fire() -> None:
    det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
    feed(det, noisy(30, rel=0.1))
    assert feed(det, [0.1, 0.1, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], start=30) == []


def test_cooldown_silences_then_a_persisting_slowdown_opens_another_window_against_the_healthy_reference() -> None:
    det = StepTimeDetector(policy(cooldown_steps=5, sustained_min_ratio=50.0, rearm_windows=3,
                                  quiet_backoff_steps=0))     # no sustained test: no quiet judgment either
    feed(det, [0.1] * 14)
    det.window_scheduled(end_step=16)
    assert feed(det, [0.3] * 7, start=14) == []              # steps 14..20 <= 16 + 5: the cooldown
    # the lagged reference has drifted into the slowdown; the healthy one has not: it fires again
    assert feed(det, [0.3] * 8, start=21)[0] == 24            # three fresh breaches after step 21
    det.window_scheduled(end_step=34)
    assert feed(det, [0.3] * 10, start=29) == []             # cooling down
    assert feed(det, [0.3] * 5, start=39)[0] == 42
    # after `rearm_windows` windows against it, the slower level is the job's new normal
    det.window_scheduled(end_step=52)
    assert feed(det, [0.3] * 30, start=44) == []
    assert feed(det, [0.9] * 4, start=74)[0] == 76           # a new slowdown is seen: three fresh breaches


def test_a_slowdown_that_starts_during_the_cooldown_of_a_window_on_a_bump_is_seen() -> None:
    """generalization case 6: a window fired on a small bump (nothing found); the fault began while
    the detector cooled down, and its lagged reference absorbed the slower steps."""
    det = StepTimeDetector(policy(cooldown_steps=20))
    times = noisy(40, rel=0.03, seed=3)
    assert feed(det, times) == []
    fired = feed(det, [0.125] * 4 + [0.1] * 4, start=40)      # a bump: a window is scheduled
    assert fired
    det.window_scheduled(end_step=fired[0] + 8 + 10)
    slow = [x * 1.4 for x in noisy(120, rel=0.03, seed=4)]   # the fault, from step 48 on
    refired = feed(det, slow, start=48)
    assert refired and refired[0] <= fired[0] + 18 + 20 + 4, refired


def test_the_anchor_is_let_go_when_the_job_recovers() -> None:
    det = StepTimeDetector(policy(cooldown_steps=5, baseline_steps=20))
    feed(det, [0.1] * 30)
    det.window_scheduled(end_step=32)
    feed(det, [0.1] * 30, start=30)                          # healthy after the window
    assert det._anchor is None
    assert feed(det, [0.08] * 40, start=60) == []             # faster: a new reference, no window


def test_excluded_steps_neither_breach_nor_enter_the_reference() -> None:
    det = StepTimeDetector(policy())
    feed(det, [0.1] * 14)
    for s in range(14, 30):
        assert not det.observe(s, 9.0, excluded=True).fire
    assert det.baseline_median_seconds == 0.1


def test_reference_follows_a_job_that_speeds_up_after_warmup() -> None:
    det = StepTimeDetector(policy(consecutive_breaches=100))
    feed(det, [0.2] * 14)
    assert feed(det, [0.1] * 20, start=14) == []             # faster never fires
    assert det.baseline_median_seconds == 0.1


def test_trimmed_mean_drops_the_single_largest() -> None:
    assert trimmed_mean([1.0, 1.0, 10.0]) == 1.0
    assert trimmed_mean([2.0, 4.0]) == 3.0


def test_a_checkpoint_that_became_slow_every_twelve_steps_fires_with_its_period() -> None:
    """A spike every 12 steps: neither the 3-in-a-row test nor the recent-mean test sees it (one
    spike in 8 recent steps is dropped as a hiccup); its regular recurrence does."""
    det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
    times = noisy(40, rel=0.05, seed=5)
    assert feed(det, times) == []
    slow = noisy(60, rel=0.05, seed=6)
    for i in range(5, 60, 12):
        slow[i] = 1.0                                           # the checkpoint, now 10x a step
    decisions = [(40 + i, det.observe(40 + i, t)) for i, t in enumerate(slow)]
    fired = [(s, d) for s, d in decisions if d.fire]
    assert fired and fired[0][1].period_steps == 12, [(s, d.reason) for s, d in fired]
    assert fired[0][0] == 40 + 5 + 24                          # at the third slow checkpoint


def test_periodic_work_the_job_always_did_is_its_design_not_a_slowdown() -> None:
    det = StepTimeDetector(policy(baseline_steps=20, recent_steps=8))
    times = noisy(120, rel=0.05, seed=7)
    for i in range(3, 120, 15):
        times[i] = 0.35                                         # an evaluation pass every 15 steps, from the start
    assert feed(det, times) == []


def test_a_plan_carries_its_own_length_through_the_store() -> None:
    from eroica.collector.sync import LocalStore, WindowCoordinator

    coord = WindowCoordinator(LocalStore(), rank=1)
    assert coord.propose(0, 30).steps is None                  # the policy's length
    assert coord.propose(1, 60, steps=13).steps == 13
    assert coord.poll(1).steps == 13 and coord.poll(1).start_step == 60


def test_a_window_is_judged_against_the_step_before_its_firing_not_the_slow_steps_since() -> None:
    """The window's "before" (written as its baseline) is the reference its firing was against: the slow
    steps that entered the reference since (the window's lead, its own steps) do not become it."""
    det = StepTimeDetector(policy(sustained_min_ratio=50.0))
    fired = feed(det, noisy(20) + [0.3] * 4)
    assert fired
    det.window_scheduled(end_step=60)
    feed(det, [0.3] * 12, start=24)               # the lead and the window: the reference takes them in
    assert det.baseline_median_seconds is not None and det.baseline_median_seconds > 0.2
    assert det.window_baseline_seconds is not None and abs(det.window_baseline_seconds - 0.1) < 0.011
