"""Presence apart from cost: a cause measured by itself (a memory cgroup at its limit with its workers
re-reading their shard) is there whatever it costs; a cause concluded from a rank's excess is as sure
as that excess."""

from __future__ import annotations

from pathlib import Path

from eroica.engine.evaluate import evaluate_incident
from eroica.engine.pipeline import DiagnoseOptions, diagnose

ROOT = Path(__file__).resolve().parents[3]


def test_a_cause_prefetching_hides_is_present_and_costs_nothing() -> None:
    inc = ROOT / "incidents" / "heldout" / "HO-0202"
    (w,) = diagnose(inc, DiagnoseOptions(in_process=True)).windows
    f = w.findings[0]
    assert (f.root_cause, f.ranks) == ("host_memory_pressure", [2])
    assert f.confidence_factors.strength_is_cost_only and f.cost is None
    assert f.confidence < 0.5 <= f.presence_confidence == f.confidence / f.confidence_factors.deviation_strength_ratio
    res = evaluate_incident(inc, DiagnoseOptions(in_process=True))
    assert not res.correct and res.present_not_costly          # said apart, never counted as right


def test_a_cause_concluded_from_the_ranks_excess_is_as_present_as_it_is_sure() -> None:
    (w,) = diagnose(ROOT / "incidents" / "INC-0001", DiagnoseOptions(in_process=True)).windows
    f = w.findings[0]
    assert f.root_cause == "dataloader_stall" and "straggler.dataloader-stall" in f.rule_ids
    assert not f.confidence_factors.strength_is_cost_only and f.presence_confidence == f.confidence
