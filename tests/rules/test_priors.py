"""Rule priors are fitted on the library, kept as data, applied by the engine; a site's word wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.evaluate import evaluate_incident, find_incidents, library_fits, naming_rules
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.priors import SHRINK, PriorSample, fit_priors, load_priors, write_priors
from eroica.engine.rules.layers import KnowledgeSpec
from eroica.engine.rules.loader import load_rules
from eroica.engine.rules.source import builtin_knowledge_dir

ROOT = Path(__file__).parents[2]


def test_the_fit_is_least_squares_shrunk_toward_the_hand_set_prior() -> None:
    always = [PriorSample("a", 1.0, True)] * 8
    never = [PriorSample("b", 1.0, False)] * 8
    few = [PriorSample("c", 1.0, False)] * 2
    fits = {f.rule_id: f for f in fit_priors(always + never + few, {"a": 0.5, "b": 0.5, "c": 0.5})}
    assert fits["a"].prior == pytest.approx((8 + SHRINK * 0.5) / (8 + SHRINK), abs=1e-3)
    assert fits["b"].prior == pytest.approx(max(0.05, SHRINK * 0.5 / (8 + SHRINK)), abs=1e-3)
    assert "c" not in fits     # too few findings: its author's prior stands


def test_the_committed_priors_file_is_what_the_library_fits_and_only_the_library(tmp_path: Path) -> None:
    """The whole file, as `eroica eval incidents --fit-priors` writes it: every rule's prior, its
    hand-set value, its findings and how many were right, and what it was fitted on (the library's
    incidents only: the held-out ones would change the counts)."""
    named = naming_rules(load_rules())
    hand = DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(fitted_priors=False))
    library = find_incidents(ROOT / "incidents")
    results = [evaluate_incident(p, hand, named.get(p.name)) for p in library]
    fits, samples = library_fits(results)
    fresh = tmp_path / "priors.yaml"
    write_priors(fresh, fits, f"incidents ({len(library)} incidents; {samples} findings)")
    committed = (builtin_knowledge_dir() / "priors.yaml").read_text()
    assert committed == fresh.read_text(), "regenerate: eroica eval incidents --fit-priors"


def test_the_engine_applies_the_fitted_prior_unless_a_site_overrides_it(tmp_path: Path) -> None:
    priors = load_priors(builtin_knowledge_dir())
    top = diagnose(ROOT / "incidents" / "INC-0017", DiagnoseOptions(in_process=True)).windows[0].findings[0]
    rid = top.confidence_factors.prior_rule_id
    assert rid in priors and top.confidence_factors.rule_ratio == priors[rid]
    hand = diagnose(ROOT / "incidents" / "INC-0017",
                    DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(fitted_priors=False)))
    assert hand.windows[0].findings[0].confidence_factors.rule_ratio == next(
        lr.rule.emit.confidence for lr in load_rules() if lr.rule.id == rid)
    ov = tmp_path / "site.yaml"
    ov.write_text(f"overrides:\n  {rid}: {{confidence: 0.995, reason: measured here}}\n")
    site = diagnose(ROOT / "incidents" / "INC-0017",
                    DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(override_files=(ov,))))
    assert next(f for f in site.windows[0].findings if f.confidence_factors.prior_rule_id == rid
                ).confidence_factors.rule_ratio == 0.995
