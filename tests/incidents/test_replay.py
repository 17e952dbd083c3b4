"""Replays every recorded incident through the engine and checks its expected diagnosis."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eroica.engine.diagnose import DiagnoseOptions, diagnose

INCIDENTS = sorted(p for p in (Path(__file__).parents[2] / "incidents").iterdir() if (p / "expected.yaml").exists())


@pytest.mark.parametrize("inc", INCIDENTS, ids=[p.name for p in INCIDENTS])
def test_incident_diagnosis(inc: Path) -> None:
    exp = yaml.safe_load((inc / "expected.yaml").read_text())
    d = diagnose(inc / "patterns", DiagnoseOptions(in_process=True))
    assert len(d.windows) == 1
    findings = d.windows[0].findings
    if exp.get("healthy"):
        assert not [f for f in findings if f.confidence >= exp["max_confidence"]]
        return
    assert findings, "no finding"
    top = findings[0]
    assert top.root_cause == exp["root_cause"] and top.ranks == exp["ranks"]
    assert top.confidence >= exp["min_confidence"]
    for rule in exp.get("must_not", []):
        others = [f for f in findings if set(f.ranks) - set(rule["ranks_other_than"])
                  and f.confidence >= rule["min_confidence"]]
        assert not others, f"blamed a victim: {others}"


def test_there_are_incidents_for_each_fault_of_the_slice() -> None:
    causes = {yaml.safe_load((p / "expected.yaml").read_text()).get("root_cause", "healthy") for p in INCIDENTS}
    assert {"dataloader_stall", "cpu_throttled", "workload_imbalance", "gc_pause", "healthy"} <= causes
