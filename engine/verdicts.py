"""One verdict per rank: two causes that reach the same rank at close confidence are not a verdict
an SRE can act on. The taxonomy says, per root cause, the evidence that tells it apart from the
others (`decided_by`: a fact on the rank and the values it must have, e.g. cpu_contention's
co-located processes' measured CPU, workload_imbalance's extra CPU use of its own, a configuration
difference that was not there while the job was healthy). When the two surest reported findings
of a rank are within `resolution.contest_margin`:
- the one whose deciding evidence is on the rank, while the other's is not, stands; the other keeps
  `explained_away_factor`, saying what decided;
- otherwise (both or neither have theirs) both keep `contest_factor`, and each says which evidence
  would have separated them.
Nothing here names a root cause: the deciding evidence is data (knowledge/taxonomy.yaml).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from eroica.engine.confidence import rescored
from eroica.engine.facts import Fact
from eroica.engine.taxonomy import Decider, Resolution, TaxonomyEntry
from eroica.schema.diagnosis import Finding

# the rules' operators (eroica.engine.rules.ir.OPERATORS), on one fact's values
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "gte": operator.ge, "gt": operator.gt, "lte": operator.le, "lt": operator.lt, "eq": operator.eq, "ne": operator.ne,
    "in": lambda have, allowed: have in allowed}


def matches(d: Decider, fact: Fact) -> bool:
    """`fact` is of the decider's kind and has every value its `where` asks for."""
    if getattr(fact, "kind", None) != d.fact:
        return False
    for name, want in d.where.items():
        have = getattr(fact, name, None)
        if have is None:
            return False
        tests: dict[str, Any] = want if isinstance(want, dict) else {"eq": want}
        try:
            if not all(_OPS[op](have, v) for op, v in tests.items()):
                return False
        except TypeError:          # a value of another type than the taxonomy expects: no match
            return False
    return True


def deciding(tax: TaxonomyEntry | None, facts: Sequence[Fact]) -> str | None:
    """The first of the cause's deciding evidence present among `facts` (the rank's), in words."""
    for d in tax.decided_by if tax is not None else ():
        for f in facts:
            if matches(d, f):
                return d.describe(f)
    return None


def _wants(tax: TaxonomyEntry | None) -> str:
    return "; or ".join(d.condition for d in tax.decided_by) if tax is not None and tax.decided_by else \
        "no deciding evidence declared (`decided_by` in its taxonomy entry: docs/rule-authoring.md)"


def one_verdict(findings: list[Finding], facts: Sequence[Fact], taxonomy: dict[str, TaxonomyEntry],
                resolution: Resolution) -> list[Finding]:
    """`findings` (one rank each, as built) with each rank's contest settled (see the module)."""
    out = list(findings)
    by_rank: dict[int, list[int]] = {}
    for i, f in enumerate(out):
        if len(f.ranks) == 1 and f.confidence >= resolution.unhealthy_at:
            by_rank.setdefault(f.ranks[0], []).append(i)
    for r, idx in by_rank.items():
        if len(idx) < 2:
            continue
        idx.sort(key=lambda i: -out[i].confidence)
        a, b = out[idx[0]], out[idx[1]]
        if a.confidence - b.confidence > resolution.contest_margin or a.root_cause == b.root_cause:
            continue
        mine = [f for f in facts if f.rank == r]
        ta, tb = taxonomy.get(a.root_cause), taxonomy.get(b.root_cause)
        ea, eb = deciding(ta, mine), deciding(tb, mine)
        if (ea is None) != (eb is None):
            win, lose, why, at = (a, b, ea, idx[1]) if ea is not None else (b, a, eb, idx[0])
            line = (f"contested on rank {r} by {win.root_cause} ({win.confidence:.2f}), which its deciding "
                    f"evidence confirms: {why}; this cause's is missing ({_wants(taxonomy.get(lose.root_cause))})")
            out[at] = _lowered(lose, resolution.explained_away_factor, win.root_cause, line)
            continue
        for i, this, other, te in ((idx[0], a, b, tb), (idx[1], b, a, ta)):
            both = ea is not None and eb is not None
            line = (f"not one verdict on rank {r}: {this.root_cause} ({this.confidence:.2f}) and {other.root_cause} "
                    f"({other.confidence:.2f}) are within {resolution.contest_margin:.2f}; "
                    + ("each has its deciding evidence" if both else
                       f"the evidence that would separate them is missing: {this.root_cause} needs "
                       f"{_wants(taxonomy.get(this.root_cause))}, {other.root_cause} needs {_wants(te)}"))
            out[i] = _lowered(this, resolution.contest_factor, other.root_cause, line)
    return out


def _lowered(f: Finding, factor: float, by: str, line: str) -> Finding:
    return rescored(f, line, contested_ratio=factor, contested_by=by)
