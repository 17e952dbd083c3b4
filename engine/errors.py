"""Engine errors.

    EngineError
    ├── RunDirError           a run directory or pattern file cannot be used (names the file)
    ├── RuleError             the rule base is wrong; the message lists every problem found
    │   └── RuleCompileError  a rule uses a construct the engine cannot run safely
    └── RuleRuntimeError      an action failed inside the rule engine (never swallowed)
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of all engine errors."""


class RunDirError(EngineError):
    """A run directory or pattern file cannot be used; names the file and, where known, the field."""

    def __init__(self, message: str, path: str | None = None, field: str | None = None) -> None:
        self.message, self.path, self.field = message, path, field
        where = "" if path is None else f"{path}{f' (field {field})' if field else ''}: "
        super().__init__(where + message)


class RuleError(EngineError):
    """One or more problems in the rule base; `problems` holds them all."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class RuleCompileError(RuleError):
    """A rule uses a construct the back end cannot run safely."""


class RuleRuntimeError(EngineError):
    """A rule action raised inside the engine."""
