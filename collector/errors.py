"""Collector errors.

    CollectorError
    └── TraceError      a profiler trace cannot be read (truncated, not a Chrome trace, no steps)

The collector itself never raises into the training loop: failures there become
`CollectorGap` facts. These errors are for readers of traces (`eroica ingest kineto`).
"""


class CollectorError(Exception):
    """Base of all collector errors."""


class TraceError(CollectorError, ValueError):
    """A profiler trace file is truncated, not a Chrome trace, or has nothing to summarize."""
