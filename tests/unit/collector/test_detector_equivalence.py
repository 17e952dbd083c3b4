"""The detector keeps its reference sorted as steps enter and leave it and caches its thresholds
(it runs at every step of every rank). Here it must decide exactly as the direct definition does:
the reference rebuilt and sorted at every step, thresholds worked out when asked. Random series
with slowdowns, spikes, excluded steps, windows scheduled when it fires, and policies replaced mid-
run (runtime control)."""

from __future__ import annotations

import random
import statistics
from collections import deque
from itertools import islice
from math import sqrt

from eroica.collector.detector import (
    HISTORY_STEPS,
    MAD_TO_SIGMA,
    MIN_REFERENCE,
    Decision,
    StepTimeDetector,
    central_mean,
    periodic_spikes,
    trimmed_mean,
)
from eroica.collector.policy import TriggerPolicy


class DirectDetector:
    """The definitions in the detector's module doc, computed from scratch at every step."""

    def __init__(self, policy: TriggerPolicy) -> None:
        self.policy = policy
        self.ref_stats: tuple[float, float, float] | None = None
        self.consecutive, self.quiet_until, self.under_anchor, self.anchor_windows = 0, -1, 0, 0
        self.anchor: tuple[float, float, float] | None = None
        self.fired_against: tuple[float, float, float] | None = None
        self.judged: deque[float] = deque()

    def against(self) -> tuple[float, float, float] | None:
        return self.anchor if self.anchor is not None else self.ref_stats

    def threshold(self) -> float | None:
        ref = self.against()
        return None if ref is None else max(ref[0] + self.policy.threshold_mad * ref[1],
                                            ref[0] * self.policy.threshold_min_ratio)

    def sustained(self) -> float | None:
        ref, pol = self.against(), self.policy
        return None if ref is None else max(ref[2] + pol.sustained_mad * ref[1] / sqrt(pol.recent_steps - 1),
                                            ref[2] * pol.sustained_min_ratio)

    def observe(self, step: int, seconds: float, excluded: bool = False) -> Decision:
        pol = self.policy
        if excluded or step < pol.warmup_steps:
            return Decision(False, False, self.threshold())
        thr, sus, judged = self.threshold(), self.sustained(), self.against()
        self.judged.append(seconds)
        while len(self.judged) > max(HISTORY_STEPS, pol.baseline_steps + pol.recent_steps):
            self.judged.popleft()
        n, r = len(self.judged), pol.recent_steps
        ref = list(islice(self.judged, max(n - pol.baseline_steps - r, 0), n - r)) if n > r else []
        if len(ref) < MIN_REFERENCE:
            self.ref_stats = None
        else:
            med = statistics.median(ref)
            self.ref_stats = (med, statistics.median([abs(x - med) for x in ref]) * MAD_TO_SIGMA, central_mean(ref))
        if thr is None or sus is None:
            return Decision(False, False, None)
        breach = seconds > thr
        self.consecutive = self.consecutive + 1 if breach else 0
        if self.anchor is not None:
            self.under_anchor = 0 if breach else self.under_anchor + 1
            if self.under_anchor >= pol.baseline_steps:
                self.anchor = None
        if step <= self.quiet_until:
            self.consecutive = 0
            return Decision(breach, False, thr)
        if self.consecutive >= pol.consecutive_breaches:
            self.fired_against = judged
            return Decision(breach, True, thr, f"{self.consecutive} steps in a row above {thr:.4f} s")
        recent = list(islice(self.judged, max(n - r, 0), n))
        level = trimmed_mean(recent)
        if len(recent) >= r and level > sus:
            self.fired_against = judged
            return Decision(breach, True, thr, f"recent steps average {level:.4f} s above {sus:.4f} s")
        if breach and judged is not None:
            found = periodic_spikes(list(self.judged), thr, judged[2], r, pol.sustained_min_ratio - 1.0)
            if found is not None:
                self.fired_against = judged
                return Decision(breach, True, thr, f"a spike above {thr:.4f} s every {found[0]} steps "
                                f"costs {found[1]:.0%} of the job's time", period_steps=found[0])
        return Decision(breach, False, thr)

    def window_scheduled(self, end_step: int) -> None:
        self.quiet_until = end_step + self.policy.cooldown_steps
        self.consecutive = self.under_anchor = 0
        if self.anchor is None:
            self.anchor, self.anchor_windows = self.fired_against or self.ref_stats, 0
        self.anchor_windows += 1
        if self.anchor_windows >= self.policy.rearm_windows:
            self.anchor = None


def _series(rng: random.Random, n: int) -> list[float]:
    base, out = rng.uniform(0.05, 0.5), []
    slow_at, factor = rng.randrange(n), rng.choice([1.0, 1.1, 1.3, 2.0])
    period = rng.choice([0, 7, 12, 25])
    for i in range(n):
        x = base * (1 + rng.uniform(-0.08, 0.08)) * (factor if i >= slow_at else 1.0)
        if period and i % period == 3 and i > n // 3:
            x *= 4
        if rng.random() < 0.02:
            x *= rng.uniform(2, 10)                      # a hiccup
        out.append(round(x, rng.choice([3, 6])))         # rounded: equal values enter and leave
    return out


def _policy(rng: random.Random) -> TriggerPolicy:
    recent = rng.randint(3, 12)
    return TriggerPolicy(warmup_steps=rng.randint(0, 12), baseline_steps=rng.randint(8, 40), recent_steps=recent,
                         consecutive_breaches=rng.randint(1, 4), cooldown_steps=rng.randint(0, 25),
                         lead_steps=max(rng.randint(4, 9), 7), rearm_windows=rng.randint(1, 3),
                         threshold_min_ratio=rng.choice([1.05, 1.15, 1.3]),
                         sustained_min_ratio=rng.choice([1.03, 1.08, 1.2]),
                         quiet_backoff_steps=0)     # the backoff after quiet windows is tested on its own


def test_the_incremental_detector_decides_as_the_direct_definition_on_random_series() -> None:
    rng = random.Random(11)
    fires = 0
    for trial in range(150):
        pol = _policy(rng)
        fast, direct = StepTimeDetector(pol), DirectDetector(pol)
        series = _series(rng, rng.randint(30, 400))
        excluded_until = -1
        for step, x in enumerate(series):
            if rng.random() < 0.01:                      # runtime control replaces the policy
                pol = _policy(rng)
                fast.policy = direct.policy = pol
            excluded = step <= excluded_until or rng.random() < 0.01
            a, b = fast.observe(step, x, excluded), direct.observe(step, x, excluded)
            a.excess_ratio = None                        # what the backoff reads (tests of their own)
            assert a == b, (trial, step, a, b)
            assert fast.threshold_seconds() == direct.threshold(), (trial, step)
            assert fast.sustained_threshold_seconds() == direct.sustained(), (trial, step)
            assert fast.baseline_median_seconds == (direct.ref_stats[0] if direct.ref_stats else None)
            if a.fire:
                fires += 1
                end = step + pol.lead_steps + pol.window_steps
                fast.window_scheduled(end)
                direct.window_scheduled(end)
                excluded_until = end
    assert fires > 100                                   # the comparison covered firing and its aftermath
