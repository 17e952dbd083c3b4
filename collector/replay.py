"""Replay a recorded step-time series through the trigger policy, offline: when would windows open?

The same detector and the same window rules as the live Monitor (a window starts `lead_steps`
after the detector fires, lasts `window_steps`, the detector skips the window's steps and the one
after it, and re-arms after `cooldown_steps`; at most `max_windows_per_hour`, on the series' own
clock), so an SRE can tune the policy on their own history before changing a running job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from eroica.collector.detector import StepTimeDetector
from eroica.collector.policy import TriggerPolicy


@dataclass(frozen=True)
class ReplayWindow:
    fired_at_step: int
    reason: str
    start_step: int
    end_step: int            # exclusive
    at_seconds: float        # when the window opens, on the series' clock
    quiet: bool = False      # the job ran no slower after it: not counted in the hour's budget


def read_step_times(path: Path) -> list[float]:
    """One step time (seconds) per line, `step,seconds` CSV (the last column), or a JSON list."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        try:
            return [float(x) for x in json.loads(text)]
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: a JSON list of step times in seconds was expected ({exc})") from exc
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        field = line.replace(";", ",").split(",")[-1].strip()
        try:
            out.append(float(field))
        except ValueError:
            if n == 1:      # a CSV header
                continue
            raise ValueError(f"{path}:{n}: {field!r} is not a step time in seconds") from None
    if not out:
        raise ValueError(f"{path}: no step times")
    return out


def replay(steps: list[float], policy: TriggerPolicy | None = None) -> list[ReplayWindow]:
    policy = policy or TriggerPolicy()
    det = StepTimeDetector(policy)
    windows: list[ReplayWindow] = []
    pending: tuple[int, int, str, int, bool] | None = None    # (start step, fired at, reason, length, periodic)
    window_end = -1
    exclude_next = False
    clock = 0.0
    opened_at: list[float] = []                        # counted in the hour's budget (quiet ones are not)
    for k, seconds in enumerate(steps):
        clock += seconds
        if pending is not None and k >= pending[0]:
            start, fired, reason, length, periodic = pending
            pending = None
            window_end = start + length
            det.window_scheduled(window_end, judged=not periodic)
            opened_at.append(round(clock, 3))
            windows.append(ReplayWindow(fired, reason, start, window_end, round(clock, 3)))
        in_window = k < window_end
        if not in_window and k == window_end:
            exclude_next = True
        if not policy.enabled:
            continue
        excluded = in_window or exclude_next
        if not in_window:
            exclude_next = False
        d = det.observe(k, seconds, excluded=excluded)
        if d.quiet_window:                             # the job ran at speed after the last window
            opened_at.remove(windows[-1].at_seconds)
            windows[-1] = replace(windows[-1], quiet=True)
        recent = [t for t in opened_at if t > clock - 3600]
        if d.fire and pending is None and not in_window and len(recent) < policy.max_windows_per_hour:
            pending = (k + policy.lead_steps, k, d.reason, policy.window_length(d.period_steps),
                       d.period_steps is not None)
    return windows


def per_hour(series: list[float], policy: TriggerPolicy, hours: float) -> tuple[int, float, int]:
    """Windows in the first hour, windows per job-hour over `hours` (the series repeated end to
    end), and how many were quiet."""
    reps = max(1, int(3600 * hours / sum(series)) + 1)
    played = series * reps
    clock, first_hour, n = 0.0, 0, 0
    for n, x in enumerate(played):
        clock += x
        if clock < 3600:
            first_hour = n + 1
        if clock >= 3600 * hours:
            break
    wins = replay(played[: n + 1], policy)
    return (sum(w.start_step < first_hour for w in wins), len(wins) * 3600 / clock, sum(w.quiet for w in wins))
