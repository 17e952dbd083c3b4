"""The screenshots in docs/ come from the browser tests: `make screenshots` runs them with
EROICA_SCREENSHOTS_DIR=docs, and each test copies the page it just checked there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SCREENSHOTS_ENV = "EROICA_SCREENSHOTS_DIR"


def keep_screenshot(shot: Path, name: str) -> None:
    """Copy a checked page's screenshot to $EROICA_SCREENSHOTS_DIR/name, when it is set."""
    where = os.environ.get(SCREENSHOTS_ENV)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(where) / name)
