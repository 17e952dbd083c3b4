"""eroica.collector: runs inside each training process.

A cheap step-time detector opens a short profiling window, synchronized by step number across
ranks; in the window it records function executions and samples hardware, then writes a
kilobyte-sized `eroica.patterns/v1` summary per rank. It never raises into the training loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eroica.collector.monitor import Monitor
    from eroica.collector.policy import TriggerPolicy
    from eroica.schema.patterns import PATTERNS_SCHEMA, PatternsDoc

__all__ = ["Monitor", "TriggerPolicy", "PatternsDoc", "PATTERNS_SCHEMA"]
_WHERE = {"Monitor": "eroica.collector.monitor", "TriggerPolicy": "eroica.collector.policy",
          "PatternsDoc": "eroica.schema.patterns", "PATTERNS_SCHEMA": "eroica.schema.patterns"}


def __getattr__(name: str) -> Any:
    """Imported on first use: the engine and the CLI import collector modules without the Monitor's."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'eroica.collector' has no attribute {name!r}")
