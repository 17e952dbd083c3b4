"""When a rank's stall becomes a suspected hang and when a confirmed one, from the job's own history.

A rank that has not stepped for `suspect_after` (max(hang_suspect_factor x the recent median step,
hang_suspect_seconds): 20 s at the default policy for any job whose step is under 4 s) records where
it stands as a *suspected* hang; after `confirm_after` (max(hang_factor x the median,
hang_floor_seconds, hang_pause_margin x the longest healthy pause so far)) it records it again as
*confirmed*; when it steps again, the record says *resolved* and how long the stall lasted. When
the peers stand at another collective than this rank (their sequence numbers, from their
heartbeats in the job's store), the suspicion comes already at `early_after` (a quarter of
hang_suspect_seconds: 5 s at the default policy): one rank has not entered the collective the
others wait in, or ran ahead of them.

The healthy pauses are the job's own: every step this rank has made since the watchdog started,
its longest kept with the step it ended (a checkpoint, an evaluation pass, a recompilation, a slow
first step). The engine weighs a suspicion by how far the stall exceeds that pause
(eroica.engine.hang.pause_factor), so a job that checkpoints for a minute is not suspected of much
until its stall outlasts the minute."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eroica.collector.policy import TriggerPolicy

EARLY_SHARE = 0.25       # a suspicion on the peers' evidence comes after this share of hang_suspect_seconds
RECENT_STEPS = 50        # the median step is the recent one (a job slows down; a hang's limit follows it)
MIN_STEPS = 3            # fewer measured steps: no median, the watchdog does not judge yet


@dataclass
class HangClock:
    suspect_seconds: float
    suspect_factor: float
    confirm_factor: float
    confirm_floor_seconds: float
    pause_margin: float
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    longest_pause_seconds: float = 0.0
    longest_pause_step: int | None = None
    steps_seen: int = 0

    def add(self, step: int, seconds: float) -> None:
        """A step this rank made (from the training thread: a deque append and a comparison)."""
        self.recent.append(seconds)
        self.steps_seen += 1
        if seconds > self.longest_pause_seconds:
            self.longest_pause_seconds, self.longest_pause_step = seconds, step

    @property
    def ready(self) -> bool:
        return len(self.recent) >= MIN_STEPS

    def median(self) -> float:
        return statistics.median(self.recent) if self.ready else 0.0

    def confirm_after(self) -> float:
        return max(self.confirm_factor * self.median(), self.confirm_floor_seconds,
                   self.pause_margin * self.longest_pause_seconds)

    def suspect_after(self) -> float:
        return min(max(self.suspect_factor * self.median(), self.suspect_seconds), self.confirm_after())

    def early_after(self) -> float:
        """When the peers standing at another collective make a stall a suspicion already."""
        early = max(self.suspect_factor * self.median(), EARLY_SHARE * self.suspect_seconds)
        return min(early, self.suspect_after())

    def state(self, stalled_seconds: float) -> str | None:
        """None (not a hang yet), "suspected" or "confirmed", for a stall of this many seconds."""
        if not self.ready or stalled_seconds <= self.suspect_after():
            return None
        return "confirmed" if stalled_seconds > self.confirm_after() else "suspected"

    def as_fields(self) -> dict[str, float | int | None]:
        """What a snapshot says of the limits and the history it was judged with."""
        return {"limit_seconds": round(self.confirm_after(), 2),
                "suspect_after_seconds": round(self.suspect_after(), 2),
                "median_step_seconds": round(self.median(), 4) if self.ready else None,
                "longest_pause_seconds": round(self.longest_pause_seconds, 3),
                "longest_pause_step": self.longest_pause_step, "steps_seen": self.steps_seen}


def hang_clock(policy: TriggerPolicy) -> HangClock:
    return HangClock(policy.hang_suspect_seconds, policy.hang_suspect_factor, policy.hang_factor,
                     policy.hang_floor_seconds, policy.hang_pause_margin)
