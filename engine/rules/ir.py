"""The rules' engine-neutral intermediate form: what the compiler produces, the rule cache keeps and
the back end runs. A module of its own so that a diagnosis with the compiled rule base cached imports
neither the compiler nor the rule schema, the YAML loader's models or the hypothesis vocabulary."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in")     # a `where` test's operators
THRESHOLD_OPS = ("gt", "gte", "lt", "lte")                   # those that take a number
VAR = re.compile(r"^\$([a-z_][a-z0-9_]*)$")
REF = re.compile(r"^\$([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)$")


@dataclass(frozen=True)
class TestIR:
    field: str
    op: str          # one of OPERATORS
    value: Any


@dataclass(frozen=True)
class JoinIR:
    field: str
    alias: str
    other_field: str


@dataclass(frozen=True)
class PatternIR:
    alias: str
    kind: str
    tests: tuple[TestIR, ...]
    joins: tuple[JoinIR, ...]


@dataclass(frozen=True)
class RuleIR:
    id: str
    taxonomy: str
    patterns: tuple[PatternIR, ...]
    confidence: float
    summary: str
    function_ref: str | None
    fix_template: str | None
    derive: tuple[tuple[str, Any], ...] | None   # ((field, value-or-ref), ...) incl. kind
    basis: str = "peers"
    needs: tuple[str, ...] = ()
    missing_evidence_factor: float = 0.5
    status: str = "experimental"

    @property
    def derived_kind(self) -> str | None:
        return None if self.derive is None else dict(self.derive)["kind"]
