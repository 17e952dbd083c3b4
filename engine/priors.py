"""Rule priors fitted on the incident library and kept as data (`knowledge/priors.yaml`).

A finding's confidence is the rule's prior times factors the engine measures (deviation strength,
step consistency, peer group, coverage, recurrence, explained away). Fitting chooses, per rule, the
prior that makes its findings' confidences closest to being right or wrong on the library (least
squares: the Brier score restricted to that rule), shrunk toward the hand-set prior so that a rule
with few findings keeps about what its author said:

    prior = (sum(x_i * y_i) + k * hand_set) / (sum(x_i ** 2) + k)

with x_i the product of the other factors of finding i, y_i = 1 when it matched an expectation, and
k = SHRINK pseudo-findings. Rules with fewer than MIN_FINDINGS findings are not fitted. The held-out
set (incidents/heldout) is never fitted on: the calibration is reported there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import RuleError
from eroica.engine.rules.source import load_data_file

SCHEMA = "eroica.priors/v1"
SHRINK = 2.0
MIN_FINDINGS = 3
BOUNDS = (0.05, 0.99)


@dataclass(frozen=True)
class PriorSample:
    rule_id: str
    others: float        # the product of the finding's other factors (confidence / prior)
    right: bool


@dataclass(frozen=True)
class PriorFit:
    rule_id: str
    hand_set: float
    prior: float
    findings: int
    right: int


def fit_priors(samples: list[PriorSample], hand_set: dict[str, float]) -> list[PriorFit]:
    by: dict[str, list[PriorSample]] = {}
    for s in samples:
        by.setdefault(s.rule_id, []).append(s)
    out = []
    for rid, ss in sorted(by.items()):
        if rid not in hand_set or len(ss) < MIN_FINDINGS:
            continue
        r0 = hand_set[rid]
        num = sum(s.others * float(s.right) for s in ss) + SHRINK * r0
        den = sum(s.others ** 2 for s in ss) + SHRINK
        prior = min(max(num / den, BOUNDS[0]), BOUNDS[1])
        out.append(PriorFit(rid, r0, round(prior, 3), len(ss), sum(s.right for s in ss)))
    return out


def write_priors(path: Path, fits: list[PriorFit], fitted_on: str) -> None:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "fitted_on": fitted_on,
        "method": f"least squares per rule, shrunk toward the hand-set prior by {SHRINK:g} pseudo-findings; "
                  f"rules with fewer than {MIN_FINDINGS} findings keep their hand-set prior (engine/priors.py)",
        "priors": {f.rule_id: {"prior": f.prior, "hand_set": f.hand_set, "findings": f.findings, "right": f.right}
                   for f in fits},
    }
    head = ("# Fitted rule priors: data written by `eroica eval incidents --fit-priors`, not by hand.\n"
            "# A site's override of a rule's confidence wins over these.\n")
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))


def load_priors(knowledge_dir: Path) -> dict[str, float]:
    p = Path(knowledge_dir) / "priors.yaml"
    if not p.exists():
        return {}
    data = load_data_file(p, SCHEMA, "regenerate it with eroica eval incidents --fit-priors")
    out = {}
    for rid, v in (data.get("priors") or {}).items():
        prior = v.get("prior") if isinstance(v, dict) else None
        if not isinstance(prior, (int, float)) or not 0 <= prior <= 1:
            raise RuleError([f"{p}: rule {rid!r}: prior must be a number in [0, 1], got {prior!r}"])
        out[str(rid)] = float(prior)
    return out
