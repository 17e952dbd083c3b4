"""Collector errors.

    CollectorError
    └── PatternFileError      a pattern file cannot be read or validated

The collector itself never raises into the training loop: failures there become
`CollectorGap` facts. These errors are for readers of what it wrote.
"""


class CollectorError(Exception):
    """Base of all collector errors."""


class PatternFileError(CollectorError):
    """A pattern file is missing, truncated or of the wrong schema."""
