"""Agreeing on the window's start *step* across ranks through the job's torch.distributed store.

Wall clocks differ across hosts by ~10 ms, so windows are aligned by step number. The first rank
whose detector fires writes `target_step` for window index `n` with a compare-and-set; every rank
polls the same key (a non-blocking `check`) once per step. Because synchronous training keeps ranks
within a step or two of each other, a lead of a few steps lets every rank see the key in time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIX = "eroica/window/"


@dataclass(frozen=True)
class WindowPlan:
    index: int
    start_step: int
    trigger: str
    triggered_by_rank: int | None
    steps: int | None = None          # its own length (a whole period of a periodic slowdown); None: the policy's


def _decode(index: int, raw: bytes | str) -> WindowPlan:
    text = raw.decode() if isinstance(raw, bytes) else raw
    step, rank, trigger, *steps = text.split(":", 3)
    return WindowPlan(index, int(step), trigger, int(rank), int(steps[0]) if steps else None)


class WindowCoordinator:
    """Thin, exception-transparent wrapper: the Monitor turns failures into gaps."""

    def __init__(self, store: Any, rank: int, prefix: str = PREFIX) -> None:
        self.store = store
        self.rank = rank
        self.prefix = prefix

    def key(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def propose(self, index: int, start_step: int, trigger: str = "detector", steps: int | None = None) -> WindowPlan:
        """Propose; returns the plan actually agreed (another rank may have won the race)."""
        value = f"{start_step}:{self.rank}:{trigger}" + (f":{steps}" if steps else "")
        agreed = self.store.compare_set(self.key(index), "", value)
        return _decode(index, agreed)

    def poll(self, index: int) -> WindowPlan | None:
        if not self.store.check([self.key(index)]):
            return None
        return _decode(index, self.store.get(self.key(index)))


class LocalStore:
    """An in-process store with the same semantics (tests, single-process use)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        cur = self.data.get(key)
        if (cur is None and expected_value == "") or cur == expected_value:
            self.data[key] = desired_value
        return self.data.get(key, expected_value).encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key].encode()

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, "0")) + amount
        self.data[key] = str(value)
        return value
