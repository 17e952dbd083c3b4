"""The host sampler helper seen from outside, for the tests that start one (unit and e2e)."""

import subprocess
import time
from pathlib import Path


def helper_pids(path: Path) -> list[int]:
    """The pids of the host helpers serving the socket at `path` (or under the directory `path`)."""
    out = subprocess.run(["pgrep", "-f", f"host_sampler {path}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_gone(path: Path, seconds: float) -> bool:
    """True once no helper of `path` runs, within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not helper_pids(path):
            return True
        time.sleep(0.2)
    return False
