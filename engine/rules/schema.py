"""The `eroica.rule/v1` YAML schema SREs author: one rule per file, tests inline."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RULE_SCHEMA = "eroica.rule/v1"


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Status(str, Enum):
    experimental = "experimental"
    test = "test"
    stable = "stable"
    deprecated = "deprecated"


class Severity(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"
    critical = "critical"


class Condition(Strict):
    """One fact pattern: `fact` kind, optional alias `as`, and field tests in `where`.

    A value `$name` binds a variable at its first use and joins (equality only) at later uses.
    """

    fact: str
    as_: str | None = Field(None, alias="as")
    where: dict[str, Any] = Field(default_factory=dict)


class Emit(Strict):
    """What the rule concludes: a finding (root cause = the rule's taxonomy) or a derived fact."""

    confidence: float = Field(ge=0, le=1)
    summary: str
    function: str | None = None          # "$alias.field" or a literal
    fix_template: str | None = None
    derive: dict[str, Any] | None = None  # {kind: <new fact kind>, field: value|$alias.field, ...}
    # what the rule judges the rank against: its peers (default); the expected range of a healthy step
    # (single-rank evidence); or an absolute measurement of something that is not the job's work (a
    # foreign process's CPU in the rank's container, with the job's own history for the slowdown), which
    # peers running different programs by design do not weaken. For the last two the peer-group factor
    # does not apply; the rule's own prior bounds it
    basis: Literal["peers", "expected_range", "absolute"] = "peers"
    # collector sources the conclusion depends on: where a suspect rank could not collect one of them
    # (an evidence_gap fact), its confidence is multiplied by missing_evidence_factor (0: it stands down)
    needs: list[str] = Field(default_factory=list)
    missing_evidence_factor: float = Field(0.5, ge=0, le=1)


class RuleTest(Strict):
    name: str
    given: list[dict[str, Any]]
    expect: list[dict[str, Any]]

    @field_validator("given")
    @classmethod
    def _kinds(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, f in enumerate(v):
            if "kind" not in f:
                raise ValueError(f"given[{i}] has no 'kind'")
        return v


class Rule(Strict):
    schema_: Literal["eroica.rule/v1"] = Field(alias="schema")
    id: str = Field(pattern=r"^[a-z0-9]+(\.[a-z0-9]+(-[a-z0-9]+)*)+$")
    title: str
    status: Status
    severity: Severity
    taxonomy: str | None = None           # the root cause it names; none for a rule that derives a hypothesis
    owner: str
    references: list[str] = Field(default_factory=list)
    falsepositives: list[str] = Field(default_factory=list)
    when: list[Condition] = Field(min_length=1)
    emit: Emit
    tests: list[RuleTest] = Field(default_factory=list)
    incidents: list[str] = Field(default_factory=list)
    # a site's rule that takes the place of an earlier layer's rule of the same id (a shipped one): why
    replaces: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _concludes_or_derives(self) -> Rule:
        if self.emit.derive is None and not self.taxonomy:
            raise ValueError("a rule names its root cause (`taxonomy: <id>`) unless it derives a hypothesis "
                             "(`emit.derive`)")
        if self.emit.derive is not None and self.taxonomy:
            raise ValueError("a rule that derives a hypothesis names no root cause; drop `taxonomy` (the rules "
                             "that consume the hypothesis name one)")
        return self
