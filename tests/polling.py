"""Waiting in tests: poll a condition until it holds or a deadline passes, never sleep a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(cond: Callable[[], T], timeout: float = 120.0, what: str = "the condition", every: float = 0.02) -> T:
    """`cond()`'s first true value; an AssertionError naming `what` (and the last value) if none comes
    within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {got!r})")
        time.sleep(every)
