from eroica.collector.detector import StepTimeDetector
from eroica.collector.policy import TriggerPolicy


def feed(det: StepTimeDetector, times: list[float], start: int = 0) -> list[int]:
    return [start + i for i, t in enumerate(times) if det.observe(start + i, t).fire]


def policy(**kw: object) -> TriggerPolicy:
    base = dict(warmup_steps=2, baseline_steps=5, consecutive_breaches=3, cooldown_steps=10)
    base.update(kw)
    return TriggerPolicy(**base)


def test_warmup_steps_are_ignored_even_when_slow() -> None:
    det = StepTimeDetector(policy())
    assert feed(det, [5.0, 5.0] + [0.1] * 5) == []
    assert det.baseline_median_seconds == 0.1


def test_fires_after_k_consecutive_breaches_not_before() -> None:
    det = StepTimeDetector(policy())
    fired = feed(det, [0.1] * 7 + [0.2, 0.2, 0.2, 0.2])
    assert fired and fired[0] == 9  # the third breach in a row


def test_two_breaches_then_recovery_do_not_fire() -> None:
    det = StepTimeDetector(policy())
    assert feed(det, [0.1] * 7 + [0.2, 0.2, 0.1, 0.2, 0.2, 0.1]) == []


def test_threshold_has_a_floor_ratio_over_a_tiny_mad() -> None:
    det = StepTimeDetector(policy(threshold_min_ratio=1.15))
    feed(det, [0.1] * 7)
    assert det.threshold_seconds() == 0.1 * 1.15
    assert not det.observe(7, 0.114).breach
    assert det.observe(8, 0.116).breach


def test_robust_threshold_ignores_one_baseline_outlier() -> None:
    det = StepTimeDetector(policy(threshold_mad=5.0))
    feed(det, [0.1, 0.1, 0.10, 0.11, 0.09, 0.10, 1.0])  # 1.0 is in the baseline, median/MAD ignore it
    assert det.baseline_median_seconds is not None and det.baseline_median_seconds < 0.11


def test_intermittent_breaches_fire_with_breach_window() -> None:
    det = StepTimeDetector(policy(breach_window=6))
    times = [0.1] * 7 + [0.2, 0.1, 0.2, 0.1, 0.2]
    assert feed(det, times) == [11]


def test_cooldown_silences_after_a_window() -> None:
    det = StepTimeDetector(policy(cooldown_steps=5))
    feed(det, [0.1] * 7)
    det.window_scheduled(end_step=10)
    assert feed(det, [0.3] * 8, start=7) == []        # steps 7..14 <= 10 + 5
    assert feed(det, [0.3] * 4, start=15) == [18]     # three fresh breaches after the cooldown


def test_excluded_steps_neither_breach_nor_enter_the_baseline() -> None:
    det = StepTimeDetector(policy())
    feed(det, [0.1] * 7)
    for s in range(7, 20):
        assert not det.observe(s, 9.0, excluded=True).fire
    assert det.baseline_median_seconds == 0.1


def test_baseline_follows_a_job_that_speeds_up_but_not_a_slowdown() -> None:
    det = StepTimeDetector(policy(consecutive_breaches=100))
    feed(det, [0.2] * 7)                                 # slow warm-up phase becomes baseline
    feed(det, [0.1] * 10, start=7)                       # the job speeds up: baseline follows
    assert det.baseline_median_seconds == 0.1
    feed(det, [0.5] * 10, start=17)                      # a slowdown breaches: never the new normal
    assert det.baseline_median_seconds == 0.1
