"""The cheap step-time detector: a robust reference, two tests, a cooldown.

Pure Python, no torch: it sees one float per step and says when to ask for a window.

The reference is the median and MAD of the `baseline_steps` steps *before* the most recent
`recent_steps` steps (a lagged reference): a slowdown that began within the recent steps is
always compared with what came before it, and a job that speeds up after warm-up soon has a
faster reference. Two tests:

- fast: a step above `median + threshold_mad * sigma` and above `median * threshold_min_ratio`;
  `consecutive_breaches` of them in a row fire (a strong, sustained fault is seen in a few steps);
- sustained: the mean of the recent steps without their single largest one (robust to one
  hiccup, but it moves with intermittent faults, which a median would ignore) above the same
  statistic of the reference by `sustained_mad * sigma / sqrt(n)` and by `sustained_min_ratio`
  (a 10-20% slowdown that no single step shows).

- periodic: the same spike every P steps (a checkpoint every P steps that became slow), which
  neither test sees when P is longer than the recent steps (one spike among them is dropped as a
  hiccup): at least three spikes above the threshold at a regular period in the job's recent
  series, which were not there (or were half as large) in the first period of that series (work
  the job always did at that period is its design, not a slowdown), costing at least
  `sustained_min_ratio` of the job's time. The decision carries the period, so the window can
  cover a whole one.

A window buys no silence. When one is scheduled, the reference it was judged against (the last
healthy one) is kept as an anchor: after the cooldown, steps are judged against the anchor, not
against a lagged reference that has drifted into a slowdown which began during the cooldown, so a
slowdown that persists or grows opens another window. The anchor is let go when the job runs
under its threshold for `baseline_steps` steps (it recovered), or after `rearm_windows` windows
against it (the slower level is the job's new normal).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from math import sqrt

from eroica.collector.policy import TriggerPolicy

MAD_TO_SIGMA = 1.4826
MIN_REFERENCE = 8
HISTORY_STEPS = 96          # the always-on series a window carries (periodic work shows at its period)


@dataclass
class Decision:
    breach: bool
    fire: bool
    threshold_seconds: float | None
    reason: str = ""
    period_steps: int | None = None      # a periodic slowdown's period: the window should cover one


def periodic_spikes(series: list[float], threshold: float, level: float, min_period: int,
                    min_cost_ratio: float) -> tuple[int, float] | None:
    """(period, share of the job's time the spikes cost) when the last three or more steps above
    `threshold` in `series` are evenly spaced (+-1 step) at a period of at least `min_period`, cost
    at least `min_cost_ratio` of the time over their span, and are new: the first period of the
    series had no spike at least half as large. None otherwise."""
    idx = [i for i, x in enumerate(series) if x > threshold]
    if len(idx) < 3:
        return None
    gaps = [b - a for a, b in zip(idx, idx[1:])]
    p = gaps[-1]
    tail = [idx[-1]]
    for g, i in zip(reversed(gaps), reversed(idx[:-1])):
        if abs(g - p) > 1:
            break
        tail.append(i)
    if len(tail) < 3 or p < min_period:
        return None
    first, last = min(tail), max(tail)
    if last + p + 1 < len(series):      # the last spike is more than a period ago: it stopped
        return None
    excess = sum(series[i] - level for i in tail)
    span = sum(series[first:last + 1]) or 1.0
    if excess / span < min_cost_ratio:
        return None
    before = series[:first]             # the job's series before the periodic spikes began
    if len(before) < p:
        return None                     # no period without them to compare with: maybe by design
    if max(before) - level >= 0.5 * (min(series[i] for i in tail) - level):
        return None                     # the same work was there before, as large: by design
    return p, excess / span


def central_mean(values: list[float], cut: float = 0.2) -> float:
    """Mean of the values between the `cut` and `1 - cut` quantiles (the reference's level: warm-up
    leftovers and hiccups at either end do not move it)."""
    v = sorted(values)
    k = int(len(v) * cut)
    mid = v[k : len(v) - k] or v
    return sum(mid) / len(mid)


def _sorted_median(v: list[float]) -> float:
    """statistics.median of a list already sorted (the same value, without sorting it again)."""
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def trimmed_mean(values: list[float]) -> float:
    """Mean without the single largest value (with fewer than 3 values: the plain mean)."""
    if len(values) < 3:
        return sum(values) / len(values)
    return (sum(values) - max(values)) / (len(values) - 1)


@dataclass
class StepTimeDetector:
    """Feed `observe(step, seconds)` once per step; `fire` says: ask for a window now.

    Steps before `warmup_steps` and steps marked `excluded` (inside a window, or the step that
    summarised it) are not judged and never enter the reference. After a window it is silent
    for `cooldown_steps` steps and needs fresh breaches.
    """

    policy: TriggerPolicy
    # (median, sigma, central mean) of the reference; recomputed only when a judged step arrives
    _ref_stats: tuple[float, float, float] | None = None
    _consecutive: int = 0
    _quiet_until_step: int = -1
    # the last healthy reference, kept while a slowdown persists after a window (see the module doc)
    _anchor: tuple[float, float, float] | None = None
    _anchor_windows: int = 0
    _under_anchor: int = 0
    _fired_against: tuple[float, float, float] | None = None   # the reference of the last firing step
    _judged: deque[float] = field(default_factory=deque)   # judged steps only: the reference, recent, periods
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_STEPS))

    def _reference(self) -> list[float]:
        recent, n = self.policy.recent_steps, len(self._judged)
        start = max(n - self.policy.baseline_steps - recent, 0)
        return list(islice(self._judged, start, n - recent)) if n > recent else []

    def _recent(self) -> list[float]:
        n = len(self._judged)
        return list(islice(self._judged, max(n - self.policy.recent_steps, 0), n))

    @property
    def baseline_median_seconds(self) -> float | None:
        return None if self._ref_stats is None else self._ref_stats[0]

    def _update_stats(self) -> None:
        """Median, MAD sigma and central mean of the reference: one sort of it and one of its
        deviations (this runs at every step of the job; statistics.median would sort three times)."""
        v = sorted(self._reference())
        n = len(v)
        if n < MIN_REFERENCE:
            self._ref_stats = None
            return
        med = _sorted_median(v)
        k = int(n * 0.2)                     # central_mean's cut, on the list already sorted
        mid = v[k : n - k] or v
        self._ref_stats = (med, _sorted_median(sorted([abs(x - med) for x in v])) * MAD_TO_SIGMA,
                           sum(mid) / len(mid))

    def _judged_against(self) -> tuple[float, float, float] | None:
        return self._anchor if self._anchor is not None else self._ref_stats

    def threshold_seconds(self) -> float | None:
        ref = self._judged_against()
        if ref is None:
            return None
        med, sigma, _ = ref
        return max(med + self.policy.threshold_mad * sigma, med * self.policy.threshold_min_ratio)

    def sustained_threshold_seconds(self) -> float | None:
        ref = self._judged_against()
        if ref is None:
            return None
        _, sigma, ref_level = ref
        n = self.policy.recent_steps - 1
        return max(ref_level + self.policy.sustained_mad * sigma / sqrt(n), ref_level * self.policy.sustained_min_ratio)

    def observe(self, step: int, seconds: float, excluded: bool = False) -> Decision:
        self.history.append(seconds)
        if excluded or step < self.policy.warmup_steps:
            return Decision(False, False, self.threshold_seconds())
        threshold = self.threshold_seconds()
        sustained_thr = self.sustained_threshold_seconds()
        judged = self._judged_against()
        self._judged.append(seconds)
        while len(self._judged) > max(HISTORY_STEPS, self.policy.baseline_steps + self.policy.recent_steps):
            self._judged.popleft()
        self._update_stats()                 # for the next step; this one is judged by the previous
        if threshold is None or sustained_thr is None:
            return Decision(False, False, None)
        breach = seconds > threshold
        self._consecutive = self._consecutive + 1 if breach else 0
        if self._anchor is not None:
            self._under_anchor = 0 if breach else self._under_anchor + 1
            if self._under_anchor >= self.policy.baseline_steps:
                self._anchor = None          # the job runs as it did before: back to the lagged reference
        if step <= self._quiet_until_step:
            self._consecutive = 0            # after the cooldown, fresh breaches are needed
            return Decision(breach, False, threshold)
        if self._consecutive >= self.policy.consecutive_breaches:
            self._fired_against = judged
            return Decision(breach, True, threshold, f"{self._consecutive} steps in a row above {threshold:.4f} s")
        recent = self._recent()
        level = trimmed_mean(recent)
        if len(recent) >= self.policy.recent_steps and level > sustained_thr:
            self._fired_against = judged
            return Decision(breach, True, threshold, f"recent steps average {level:.4f} s above {sustained_thr:.4f} s")
        if breach and judged is not None:
            found = periodic_spikes(list(self._judged), threshold, judged[2], self.policy.recent_steps,
                                    self.policy.sustained_min_ratio - 1.0)
            if found is not None:
                self._fired_against = judged
                return Decision(breach, True, threshold, f"a spike above {threshold:.4f} s every {found[0]} steps "
                                f"costs {found[1]:.0%} of the job's time", period_steps=found[0])
        return Decision(breach, False, threshold)

    def window_scheduled(self, end_step: int) -> None:
        """A window is set to end at `end_step`: stay quiet until the cooldown after it, then judge
        against the reference of this moment (the anchor) while the slowdown persists."""
        self._quiet_until_step = end_step + self.policy.cooldown_steps
        self._consecutive = 0
        self._under_anchor = 0
        if self._anchor is None:   # the reference the detector fired against, before the slow steps entered it
            self._anchor, self._anchor_windows = self._fired_against or self._ref_stats, 0
        self._anchor_windows += 1
        if self._anchor_windows >= self.policy.rearm_windows:
            self._anchor = None              # that many windows against it: the slower level is the new normal
