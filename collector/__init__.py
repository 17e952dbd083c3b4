"""eroica.collector: runs inside each training process.

A cheap step-time detector opens a short profiling window, synchronized by step number across
ranks; in the window it records function executions and samples hardware, then writes a
kilobyte-sized `eroica.patterns/v1` summary per rank. It never raises into the training loop.
"""

from eroica.collector.facts import PATTERNS_SCHEMA, PatternsDoc
from eroica.collector.monitor import Monitor
from eroica.collector.policy import TriggerPolicy

__all__ = ["Monitor", "TriggerPolicy", "PatternsDoc", "PATTERNS_SCHEMA"]
