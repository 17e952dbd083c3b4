"""A finding's confidence, in one place: the product of its named factors.

Each stage of a diagnosis that weighs a finding sets its own factor (eroica.schema.diagnosis.FACTORS
lists them in order: the rule's prior, the strength, the consistency, the peers, the coverage, the
evidence missing, explained away, contested, standing, across windows) and the confidence is always
recomputed from all of them here, so the number a report prints is the product of the factors it
lists, whichever stage ran last.
"""

from __future__ import annotations

import math
from typing import Any

from eroica.schema.diagnosis import FACTORS, ConfidenceFactors, Finding


def confidence_of(cf: ConfidenceFactors, leave_out: str | None = None) -> float:
    """The product of every factor (but `leave_out`), rounded as findings carry it."""
    return round(math.prod(float(getattr(cf, name)) for name, _label, _always, _how in FACTORS
                           if name != leave_out), 4)


def presence_of(cf: ConfidenceFactors) -> float:
    """How sure the cause is present, apart from what it costs: the confidence, without the strength
    where the strength measures only the cost (`strength_is_cost_only`)."""
    return confidence_of(cf, "deviation_strength_ratio" if cf.strength_is_cost_only else None)


def rescored(f: Finding, evidence_first: str | None = None, **factors: Any) -> Finding:
    """The finding with these factors (and their notes: `explained_away_by`, ...) set and its confidence
    recomputed from all of them; `evidence_first` is put before its evidence (why a factor was applied)."""
    cf = f.confidence_factors.model_copy(update=factors)
    update: dict[str, Any] = {"confidence": confidence_of(cf), "confidence_factors": cf,
                              "presence_confidence": presence_of(cf)}
    if evidence_first is not None:
        update["evidence"] = [evidence_first, *f.evidence]
    return f.model_copy(update=update)
