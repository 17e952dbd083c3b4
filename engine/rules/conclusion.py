"""What the rule engine hands back: typed conclusions and derived facts, with their provenance.

The rule engine's worker process speaks plain data (durable-rules takes and gives JSON); these
models are built from it as soon as it crosses back, so nothing past `engine/rules/runner.py` sees
a dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny

from eroica.engine.facts import FACT_TYPES, Fact
from eroica.engine.hypotheses import hypothesis_types


class Conclusion(BaseModel):
    """One rule's conclusion about one rank: a root cause (a finding to be) with what it rests on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule_id: str
    root_cause: str
    rank: int
    function: str | None = None
    rule_confidence: float                   # the rule's prior: how often it is right when it fires
    summary: str
    fix_template: str | None = None
    basis: str = "peers"                     # peers, or the expected range of a healthy step
    needs: tuple[str, ...] = ()              # collector sources it depends on
    missing_evidence_factor: float = 0.5     # applied where one of them is missing on its rank
    # the measured facts it rests on; hypotheses on the way are expanded into the facts they came from
    facts: tuple[SerializeAsAny[Fact], ...]
    hypotheses: tuple[SerializeAsAny[Fact], ...] = ()   # the derived facts on the way, first to last
    via: tuple[str, ...] = ()                # the rules that derived them, first to last


class Derived(BaseModel):
    """A hypothesis one rule derived, and the rule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule_id: str
    fact: SerializeAsAny[Fact]


def typed_fact(d: dict[str, Any], types: dict[str, type[Fact]]) -> Fact:
    """A fact dict from the engine as its model (an unknown kind is a bug in the compiler, not data)."""
    return types[str(d["kind"])].model_validate(d)


def typed_results(raw: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                  site_dirs: list[Path] | None = None) -> tuple[list[Conclusion], list[Derived]]:
    kinds = {str(f["kind"]) for c in raw[0] for f in (*c["facts"], *c["hypotheses"])}
    kinds.update(str(d["fact"]["kind"]) for d in raw[1])
    # the hypothesis models are built from knowledge files (not free): only those a rule derived
    extra = kinds - FACT_TYPES.keys()
    types = {**FACT_TYPES, **hypothesis_types(extra, site_dirs)} if extra else FACT_TYPES
    conclusions = [
        Conclusion(**{**c, "facts": tuple(typed_fact(f, types) for f in c["facts"]),
                      "hypotheses": tuple(typed_fact(f, types) for f in c["hypotheses"])})
        for c in raw[0]
    ]
    derived = [Derived(rule_id=d["rule_id"], fact=typed_fact(d["fact"], types)) for d in raw[1]]
    return conclusions, derived
