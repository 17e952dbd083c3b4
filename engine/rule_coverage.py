"""`eroica rules coverage`: replay recorded incidents with a knowledge and say, per rule, in which
incidents it fires (concludes or derives, whether or not its conclusion became the finding), in which
it decides a reported finding (the finding's confidence is its prior times the measured factors), and
which rules never fire at all: a rule base's blind spots, and a site rule's reach, before it is trusted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eroica.engine.evaluate import find_heldout, find_incidents
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.rules.layers import Knowledge

REPORTED = 0.5       # a finding at this confidence or more is reported (the taxonomy's default unhealthy_at)


@dataclass
class RuleCoverage:
    fires: list[str] = field(default_factory=list)      # incidents where it concluded or derived
    decides: list[str] = field(default_factory=list)    # incidents where it decided a reported finding


@dataclass
class Coverage:
    incidents: list[str]
    rules: dict[str, RuleCoverage]
    hang_rules: list[str] = field(default_factory=list)    # rules on a hang's facts: they fire on hangs only

    def as_json(self) -> dict[str, Any]:
        return {"incidents": self.incidents,
                "rules": {k: {"fires": v.fires, "decides": v.decides} for k, v in sorted(self.rules.items())},
                "never_fired": sorted(k for k, v in self.rules.items() if not v.fires),
                "hang_rules": self.hang_rules}


def incident_dirs(paths: list[Path]) -> list[Path]:
    """The incidents under each path: a library (with its heldout/), one incident, or a site directory
    (its incidents/)."""
    out: list[Path] = []
    for p in paths:
        found = find_incidents(p) + find_heldout(p)
        if not found and (p / "incidents").is_dir():
            found = find_incidents(p / "incidents") + find_heldout(p / "incidents")
        out += found
    return list(dict.fromkeys(out))


def coverage(k: Knowledge, paths: list[Path], progress: Callable[[str], None] | None = None) -> Coverage:
    opts = DiagnoseOptions(knowledge=k.spec, in_process=True)
    incs = incident_dirs(paths)
    rules = {lr.rule.id: RuleCoverage() for lr in k.rules}
    for n, inc in enumerate(incs, 1):
        if progress is not None and (n % 10 == 0 or n == len(incs)):
            progress(f"{n}/{len(incs)} incidents replayed")
        d = diagnose(inc / "patterns" if (inc / "patterns").is_dir() else inc, opts)
        name = inc.name if inc.parent.name != "heldout" else f"heldout/{inc.name}"
        fired = {r for w in d.windows for r in w.rules_fired}
        decided = {str(f.confidence_factors.prior_rule_id) for w in d.windows for f in w.findings
                   if f.confidence >= REPORTED}
        for rid in fired & rules.keys():
            rules[rid].fires.append(name)
        for rid in decided & rules.keys():
            rules[rid].decides.append(name)
    hang = sorted(ir.id for ir in k.irs if any(
        (ks := k.vocabulary.kinds.get(p.kind)) is not None and ks.context == "hang" for p in ir.patterns))
    return Coverage([i.name for i in incs], rules, hang)
