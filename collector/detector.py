"""The cheap step-time detector: a robust baseline, a threshold, K breaches, a cooldown.

Pure Python, no torch: it sees one float per step and says when to ask for a window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from eroica.collector.policy import TriggerPolicy

MAD_TO_SIGMA = 1.4826


@dataclass
class Decision:
    breach: bool
    fire: bool
    threshold_seconds: float | None


@dataclass
class StepTimeDetector:
    """Feed `observe(step, seconds)` once per step; `fire` says: ask for a window now.

    - Steps before `warmup_steps` are ignored.
    - The baseline is the median and MAD of the last `baseline_steps` steps that did not breach:
      it follows a job that speeds up after warm-up, but a slowdown (breaching steps) never
      becomes the new normal.
    - A breach is a step above `median + threshold_mad * 1.4826 * MAD` and above
      `median * threshold_min_ratio`.
    - It fires after `consecutive_breaches` breaches in a row (or, with `breach_window`, that
      many within the last `breach_window` steps, for intermittent faults).
    - Steps marked `excluded` (inside a window, or the step that summarised it) are not judged.
    - After a window it is silent for `cooldown_steps` steps.
    """

    policy: TriggerPolicy
    _baseline: deque[float] = field(default_factory=deque)
    _median: float | None = None
    _mad: float | None = None
    _recent: deque[bool] = field(default_factory=deque)
    _consecutive: int = 0
    _quiet_until_step: int = -1
    history: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def baseline_median_seconds(self) -> float | None:
        return self._median

    def threshold_seconds(self) -> float | None:
        if self._median is None or self._mad is None:
            return None
        return max(
            self._median + self.policy.threshold_mad * MAD_TO_SIGMA * self._mad,
            self._median * self.policy.threshold_min_ratio,
        )

    def observe(self, step: int, seconds: float, excluded: bool = False) -> Decision:
        self.history.append(seconds)
        if excluded or step < self.policy.warmup_steps:
            return Decision(False, False, self.threshold_seconds())
        if self._median is None:
            self._push_baseline(seconds)
            return Decision(False, False, self.threshold_seconds())
        threshold = self.threshold_seconds()
        assert threshold is not None
        breach = seconds > threshold
        if not breach:
            self._push_baseline(seconds)
        self._consecutive = self._consecutive + 1 if breach else 0
        if self.policy.breach_window:
            self._recent.append(breach)
            while len(self._recent) > self.policy.breach_window:
                self._recent.popleft()
        if step <= self._quiet_until_step:
            self._consecutive = 0            # after the cooldown, K fresh breaches are needed
            self._recent.clear()
            return Decision(breach, False, threshold)
        fire = self._consecutive >= self.policy.consecutive_breaches
        if self.policy.breach_window and sum(self._recent) >= self.policy.consecutive_breaches:
            fire = True
        return Decision(breach, fire, threshold)

    def _push_baseline(self, seconds: float) -> None:
        self._baseline.append(seconds)
        while len(self._baseline) > self.policy.baseline_steps:
            self._baseline.popleft()
        if len(self._baseline) >= self.policy.baseline_steps:
            self._median = median(self._baseline)
            self._mad = median(abs(x - self._median) for x in self._baseline)

    def window_scheduled(self, end_step: int) -> None:
        """A window is set to end at `end_step`: stay quiet until the cooldown after it."""
        self._quiet_until_step = end_step + self.policy.cooldown_steps
        self._consecutive = 0
        self._recent.clear()
