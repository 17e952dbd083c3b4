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

Quiet windows back the detector off. A window after which the job ran no slower than the reference
it fired against (the central mean of the recent_steps judged steps after it, taken as the
reference's level is, under the sustained test's threshold: the slowdown had passed; the window's
own steps are not used, since profiling slows some jobs by 10-20%) is quiet. A noisy machine's
bursts make such windows; a fault does not. After one, a firing must hold `quiet_backoff_steps`
judged steps in a row, four times as many after each further quiet window within
`quiet_memory_hours` (on the series' own clock), up to `quiet_backoff_max_steps`, judged against the
reference it first fired against (pinned: the lagged one would drift into a slowdown before a long
hold ends). Bursts shorter than that no longer open windows; a sustained slowdown still does; one at
least CLEAR_OF_NOISE times as far above its reference as the tallest burst that passed needs no
hold; with no quiet window remembered the detector is exactly as quick as before. Quiet windows are
not counted in the hour's budget (`max_windows_per_hour`), so a fault after a noisy spell still gets
its window.

A window buys no silence. When one is scheduled, the reference it was judged against (the last
healthy one) is kept as an anchor: after the cooldown, steps are judged against the anchor, not
against a lagged reference that has drifted into a slowdown which began during the cooldown, so a
slowdown that persists or grows opens another window. The anchor is let go when the job runs
under its threshold for `baseline_steps` steps (it recovered), or after `rearm_windows` windows
against it (the slower level is the job's new normal).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from math import sqrt
from operator import sub

from eroica.collector.policy import TriggerPolicy

MAD_TO_SIGMA = 1.4826
HOUR_SECONDS = 3600.0
CLEAR_OF_NOISE = 2.0        # a firing this many times as far above its reference as the hour's passing bursts: no hold
MIN_REFERENCE = 8
HISTORY_STEPS = 96          # the always-on series a window carries (periodic work shows at its period)


@dataclass(slots=True)
class Decision:
    breach: bool
    fire: bool
    threshold_seconds: float | None
    reason: str = ""
    period_steps: int | None = None      # a periodic slowdown's period: the window should cover one
    excess_ratio: float | None = None    # how much slower than the reference the firing steps ran (0.2: 20%)
    quiet_window: bool = False           # this step ended the judgment of the last window: it was quiet


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


def trimmed_mean(values: Sequence[float]) -> float:
    """Mean without the single largest value (with fewer than 3 values: the plain mean)."""
    if len(values) < 3:
        return sum(values) / len(values)
    return (sum(values) - max(values)) / (len(values) - 1)


class StepTimeDetector:
    """Feed `observe(step, seconds)` once per step; `fire` says: ask for a window now.

    Steps before `warmup_steps` and steps marked `excluded` (inside a window, or the step that
    summarised it) are not judged and never enter the reference. After a window it is silent
    for `cooldown_steps` steps and needs fresh breaches.

    This runs at every step of every rank. Right after the user's step the caches and the TLB
    hold the user's data, and the first step judged costs several times the next (not the
    arithmetic: a leaner detector left the cold cost as it was; docs/benchmarks.md), so the Monitor
    hands it steps in turns (JUDGE_EVERY_STEPS). The per-step work is kept small too: the reference
    and the recent steps live in `array('d')` buffers (the reference kept sorted as steps enter and
    leave it, not rebuilt), the policy's numbers are copied onto the detector, and the two
    thresholds are worked out when a reference, an anchor or the policy changes. The decisions are
    those of the definitions above, to the bit (tested against a direct implementation on random
    series).
    """

    __slots__ = ("_policy", "history", "_ref_stats", "_consecutive", "_quiet_until_step", "_anchor",
                 "_anchor_windows", "_under_anchor", "_fired_against", "_judged", "_ref", "_ref_fifo", "_recent",
                 "_thr", "_sus", "_b", "_r", "_warmup", "_tmad", "_tmin", "_smad", "_smin", "_sqrt_n",
                 "clock_seconds", "_quiet_at", "_held", "_window_ref", "_fired_excess", "_window_excess", "_pinned",
                 "_after")

    def __init__(self, policy: TriggerPolicy) -> None:
        self._policy = policy
        self.history: deque[float] = deque(maxlen=HISTORY_STEPS)
        # (median, sigma, central mean) of the reference; recomputed only when a judged step arrives
        self._ref_stats: tuple[float, float, float] | None = None
        self._consecutive = 0
        self._quiet_until_step = -1
        # the last healthy reference, kept while a slowdown persists after a window (see the module doc)
        self._anchor: tuple[float, float, float] | None = None
        self._anchor_windows = 0
        self._under_anchor = 0
        self._fired_against: tuple[float, float, float] | None = None   # the reference of the last firing step
        self._judged: deque[float] = deque()     # judged steps only (periodic spikes; a policy change rebuilds from it)
        self.clock_seconds = 0.0                 # the series' own clock: every step observed, summed
        self._quiet_at: deque[tuple[float, float]] = deque()   # (clock, its firing's excess): the hour's quiet windows
        self._held = 0                           # judged steps in a row on which a test would fire
        self._window_ref: tuple[float, float, float] | None = None   # what the scheduled window is judged by
        self._fired_excess: float | None = None  # the last firing's excess ratio, and the scheduled window's
        self._window_excess: float | None = None
        # while a firing holds through a backoff: the reference it first fired against (the lagged
        # reference would drift into a slowdown before a long hold could end)
        self._pinned: tuple[float, float, float] | None = None
        # the judged steps after a detector window (unprofiled: its own cost does not count), until
        # there are recent_steps of them; None when no window awaits judgment
        self._after: tuple[int, list[float]] | None = None
        self._follow_policy()

    @property
    def policy(self) -> TriggerPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: TriggerPolicy) -> None:
        """Runtime control replaces the policy: the detector follows it at once."""
        self._policy = policy
        self._follow_policy()

    def _follow_policy(self) -> None:
        """A new policy (at start, or runtime control): copy its numbers and rebuild the buffers
        that depend on its sizes from the judged steps."""
        pol, n = self._policy, len(self._judged)
        r = self._r = pol.recent_steps
        self._b, self._warmup = pol.baseline_steps, pol.warmup_steps
        self._tmad, self._tmin = pol.threshold_mad, pol.threshold_min_ratio
        self._smad, self._smin, self._sqrt_n = pol.sustained_mad, pol.sustained_min_ratio, sqrt(r - 1)
        start = max(n - self._b - r, 0)
        self._ref_fifo = array("d", islice(self._judged, start, n - r) if n > r else ())   # in step order
        self._ref = array("d", sorted(self._ref_fifo))                                     # the same, sorted
        self._recent = array("d", islice(self._judged, max(n - r, 0), n))                  # the last r, in order
        self._set_thresholds()

    def _set_thresholds(self) -> None:
        ref = self._anchor or self._pinned or self._ref_stats
        if ref is None:
            self._thr = self._sus = None
            return
        med, sigma, level = ref
        self._thr = max(med + self._tmad * sigma, med * self._tmin)
        self._sus = max(level + self._smad * sigma / self._sqrt_n, level * self._smin)

    @property
    def baseline_median_seconds(self) -> float | None:
        return None if self._ref_stats is None else self._ref_stats[0]

    @property
    def window_baseline_seconds(self) -> float | None:
        """The step the scheduled window is judged against: the reference its firing was against (before
        the slow steps entered the reference: a recurring fault's earlier slow phase does not become
        the window's "before"), else the reference now."""
        ref = self._window_ref or self._ref_stats
        return None if ref is None else ref[0]

    def threshold_seconds(self) -> float | None:
        return self._thr

    def sustained_threshold_seconds(self) -> float | None:
        return self._sus

    def _add_judged(self, seconds: float) -> None:
        """A judged step enters the recent steps; the oldest recent step enters the reference, and
        the reference's oldest leaves it. Then the reference's median, MAD sigma and central mean
        from the sorted buffer (one sort: of the deviations)."""
        judged, recent, ref = self._judged, self._recent, self._ref
        judged.append(seconds)
        while len(judged) > HISTORY_STEPS and len(judged) > self._b + self._r:
            judged.popleft()
        recent.append(seconds)
        if len(recent) > self._r:
            x = recent[0]
            del recent[0]
            fifo = self._ref_fifo
            fifo.append(x)
            insort(ref, x)
            if len(fifo) > self._b:
                del ref[bisect_left(ref, fifo[0])]
                del fifo[0]
        m = len(ref)
        if m < MIN_REFERENCE:
            self._ref_stats = None
        else:
            med = ref[m // 2] if m % 2 else (ref[m // 2 - 1] + ref[m // 2]) / 2
            k = int(m * 0.2)                     # central_mean's cut, on the buffer already sorted
            mid = ref[k : m - k] or ref
            self._ref_stats = (med, _sorted_median(sorted(map(abs, map(sub, ref, repeat(med, m))))) * MAD_TO_SIGMA,
                               sum(mid) / len(mid))
        self._set_thresholds()

    def hold_steps(self, excess_ratio: float | None = None) -> int:
        """Judged steps in a row a firing `excess_ratio` slower than its reference must hold now: 1
        with no quiet window remembered, for a periodic firing (None), or for one at least
        CLEAR_OF_NOISE times as far above its reference as any burst that passed; else the backoff."""
        q = self._quiet_at
        while q and q[0][0] < self.clock_seconds - self._policy.quiet_memory_hours * HOUR_SECONDS:
            q.popleft()
        base = self._policy.quiet_backoff_steps
        if not q or base == 0 or excess_ratio is None or excess_ratio >= CLEAR_OF_NOISE * max(e for _, e in q):
            return 1
        return min(base << min(2 * (len(q) - 1), 16), self._policy.quiet_backoff_max_steps)

    def observe(self, step: int, seconds: float, excluded: bool = False) -> Decision:
        d = self._observe(step, seconds, excluded)
        if excluded or step < self._warmup:
            return d                             # not judged: a streak neither grows nor breaks
        if self._after is not None and step > self._after[0]:
            d.quiet_window = self._judge_window(seconds)
        if not d.fire:
            self._held = 0
            if self._pinned is not None:
                self._pinned = None
                self._set_thresholds()
            return d
        self._held += 1
        if d.excess_ratio is not None:          # the burst's height so far (what a quiet window remembers)
            self._fired_excess = max(self._fired_excess or 0.0, d.excess_ratio)
        need = self.hold_steps(d.excess_ratio if d.period_steps is None else None)
        if need > 1 and self._held < need:
            if self._pinned is None and self._anchor is None:
                self._pinned = self._fired_against
                self._set_thresholds()
            return Decision(d.breach, False, d.threshold_seconds)
        if need > 1:
            d.reason += f" (held {need} steps: {len(self._quiet_at)} quiet window(s) remembered)"
        return d

    def _observe(self, step: int, seconds: float, excluded: bool) -> Decision:
        self.history.append(seconds)
        self.clock_seconds += seconds
        threshold, sustained_thr = self._thr, self._sus     # this step is judged by the previous reference
        if excluded or step < self._warmup:
            return Decision(False, False, threshold)
        judged = self._anchor or self._pinned or self._ref_stats
        self._add_judged(seconds)                           # for the next step
        if threshold is None or sustained_thr is None:
            return Decision(False, False, None)
        breach = seconds > threshold
        self._consecutive = self._consecutive + 1 if breach else 0
        if self._anchor is not None:
            self._under_anchor = 0 if breach else self._under_anchor + 1
            if self._under_anchor >= self._b:
                self._anchor = None          # the job runs as it did before: back to the lagged reference
                self._set_thresholds()
        if step <= self._quiet_until_step:
            self._consecutive = 0            # after the cooldown, fresh breaches are needed
            return Decision(breach, False, threshold)
        pol = self.policy
        if self._consecutive >= pol.consecutive_breaches:
            self._fired_against = judged
            low = min(self._recent[-min(self._consecutive, len(self._recent)):]) if judged else seconds
            return Decision(breach, True, threshold, f"{self._consecutive} steps in a row above {threshold:.4f} s",
                            excess_ratio=low / judged[0] - 1.0 if judged and judged[0] > 0 else None)
        recent = self._recent
        if len(recent) >= self._r:
            level = trimmed_mean(recent)
            if level > sustained_thr:
                self._fired_against = judged
                return Decision(breach, True, threshold, excess_ratio=level / judged[2] - 1.0
                                if judged and judged[2] > 0 else None, reason=
                                f"recent steps average {level:.4f} s above {sustained_thr:.4f} s")
        if breach and judged is not None:
            found = periodic_spikes(list(self._judged), threshold, judged[2], self._r, self._smin - 1.0)
            if found is not None:
                self._fired_against = judged
                return Decision(breach, True, threshold, f"a spike above {threshold:.4f} s every {found[0]} steps "
                                f"costs {found[1]:.0%} of the job's time", period_steps=found[0])
        return Decision(breach, False, threshold)

    def _judge_window(self, seconds: float) -> bool:
        """One more judged step after the last window; with recent_steps of them, True when the window
        was quiet: their central mean (taken as the reference's level is: a spike of the job's own,
        an eval or a checkpoint, is cut off) under the sustained threshold of the reference it fired
        against. The window's own steps are not used: profiling slows some jobs by 10-20%."""
        assert self._after is not None
        after = self._after[1]
        after.append(seconds)
        ref, excess = self._window_ref, self._window_excess
        if len(after) < self._r or ref is None or excess is None:
            return False
        self._after = self._window_ref = self._window_excess = None
        _, sigma, level = ref
        if central_mean(after) > max(level + self._smad * sigma / self._sqrt_n, level * self._smin):
            return False
        self._quiet_at.append((self.clock_seconds, max(excess, 0.0)))
        return True

    def window_scheduled(self, end_step: int, judged: bool = True) -> None:
        """A window is set to end at `end_step`: stay quiet until the cooldown after it, then judge
        against the reference of this moment (the anchor) while the slowdown persists. `judged`: a
        detector's window (not a periodic one, not one asked for), judged quiet or not by the steps
        after it."""
        self._quiet_until_step = end_step + self.policy.cooldown_steps
        self._consecutive = 0
        self._under_anchor = 0
        self._held = 0
        self._window_ref = ref = self._fired_against or self._ref_stats
        if self._fired_excess is None and ref is not None and ref[2] > 0 and len(self._recent) >= 2:
            self._fired_excess = max(trimmed_mean(self._recent) / ref[2] - 1.0, 0.0)   # another rank fired
        self._window_excess, self._fired_excess = self._fired_excess, None
        self._pinned = None
        self._after = (end_step, []) if judged and self._policy.quiet_backoff_steps else None
        if self._anchor is None:   # the reference the detector fired against, before the slow steps entered it
            self._anchor, self._anchor_windows = self._fired_against or self._ref_stats, 0
        self._anchor_windows += 1
        if self._anchor_windows >= self.policy.rearm_windows:
            self._anchor = None              # that many windows against it: the slower level is the new normal
        self._set_thresholds()
