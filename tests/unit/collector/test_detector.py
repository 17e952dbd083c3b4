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


def test_cooldown_silences_after_a_window_and_a_persisting_slowdown_becomes_the_reference() -> None:
    det = StepTimeDetector(policy(cooldown_steps=5, sustained_min_ratio=50.0))
    feed(det, [0.1] * 14)
    det.window_scheduled(end_step=16)
    assert feed(det, [0.3] * 7, start=14) == []              # steps 14..20 <= 16 + 5
    assert feed(det, [0.3] * 8, start=21) == []              # the same slowdown is not profiled again
    assert feed(det, [0.9] * 4, start=29)[0] == 31         # a new one is: three fresh breaches


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
