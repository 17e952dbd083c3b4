"""Real multi-rank jobs on a 2-core machine: four ranks share two cores, so a run can be disturbed
by the machine itself. A failed first attempt is shown and the job runs once more (both are real)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def twice(check: Callable[[Path], None], tmp_path: Path) -> None:
    try:
        check(tmp_path / "attempt-1")
    except AssertionError as first:
        print(f"first attempt failed, running the job again: {first}")
        check(tmp_path / "attempt-2")
