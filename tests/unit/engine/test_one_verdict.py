"""One verdict per rank (eroica.engine.verdicts): two causes reported on one rank within the contest
margin are decided by the evidence the taxonomy says tells them apart, or both are lowered and each
says what evidence is missing; the taxonomy's deciding evidence must name real facts and fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.errors import RuleError
from eroica.engine.facts import ConfigDeviation, Fact, HardwareSignal, HostCpuLoad
from eroica.engine.taxonomy import load_resolution, load_taxonomy
from eroica.engine.verdicts import one_verdict
from eroica.schema.diagnosis import ConfidenceFactors, Finding, FindingCategory

TAX = load_taxonomy()
RES = load_resolution()


def finding(cause: str, rank: int, confidence: float) -> Finding:
    return Finding(root_cause=cause, category=FindingCategory(TAX[cause].category), component="c", ranks=[rank],
                   hosts=["h"], function="f", confidence=confidence, summary=cause, evidence=[f"{cause} evidence"],
                   rule_ids=[f"r.{cause}"], confidence_factors=ConfidenceFactors(
                       rule_ratio=confidence, deviation_strength_ratio=1, step_consistency_ratio=1, peer_group_ratio=1,
                       coverage_ratio=1, peer_group="g", peer_group_valid=True))


def host(rank: int, other: float) -> HostCpuLoad:
    return HostCpuLoad(rank=rank, host="node-2", cores_total=2, busy_cores=2.0, job_cores=2.0 - other,
                       other_cores=other, busy_ratio=1.0, ranks_on_host=2)


def cpu(rank: int, ratio: float) -> HardwareSignal:
    return HardwareSignal(rank=rank, signal="cpu_util_ratio", value=0.3 * ratio, peer_median=0.3,
                          delta=0.3 * ratio - 0.3, ratio_to_median=ratio)


def verdict(fs: list[Finding], facts: list[Fact]) -> dict[str, Finding]:
    return {f.root_cause: f for f in one_verdict(fs, facts, TAX, RES)}


def test_the_cause_whose_deciding_evidence_is_on_the_rank_stands_and_the_other_is_explained_away() -> None:
    """workload_imbalance above cpu_contention on the contended rank (seen on another job): the
    co-located processes' measured CPU is there, the rank's own extra CPU use is not."""
    got = verdict([finding("workload_imbalance", 2, 0.78), finding("cpu_contention", 2, 0.72)],
                  [host(2, 1.3), cpu(2, 0.9), host(1, 0.1)])
    cc, wi = got["cpu_contention"], got["workload_imbalance"]
    assert cc.confidence == 0.72 and cc.confidence_factors.contested_by is None
    assert wi.confidence == pytest.approx(0.78 * RES.explained_away_factor)
    assert (wi.confidence_factors.contested_by, wi.confidence_factors.contested_ratio) == (
        "cpu_contention", RES.explained_away_factor)
    assert "processes outside the job keep 1.3 of node-2's 2 cores busy" in wi.evidence[0]
    assert "cpu_util_ratio" in wi.evidence[0]              # what would have made it the verdict


def test_a_setting_that_was_there_while_the_job_was_healthy_does_not_tie_with_contention() -> None:
    dev = ConfigDeviation(rank=3, key="cpu.affinity_count", value="1", peer_value="2", seen_while_healthy=True)
    got = verdict([finding("framework_config", 3, 0.7), finding("cpu_contention", 3, 0.7)], [dev, host(3, 1.0)])
    assert got["cpu_contention"].confidence == 0.7
    assert got["framework_config"].confidence_factors.contested_by == "cpu_contention"
    fresh = dev.model_copy(update={"seen_while_healthy": False})      # new since the healthy windows: both have theirs
    got = verdict([finding("framework_config", 3, 0.7), finding("cpu_contention", 3, 0.7)], [fresh, host(3, 1.0)])
    assert [f.confidence for f in got.values()] == [pytest.approx(0.7 * RES.contest_factor)] * 2
    assert all("each has its deciding evidence" in f.evidence[0] for f in got.values())


def test_without_deciding_evidence_both_are_lowered_and_say_what_is_missing() -> None:
    got = verdict([finding("cpu_contention", 1, 0.66), finding("workload_imbalance", 1, 0.6)],
                  [host(1, 0.2), cpu(1, 1.0)])
    for f in got.values():
        assert f.confidence_factors.contested_ratio == RES.contest_factor
        assert "the evidence that would separate them is missing" in f.evidence[0]
        assert "host_cpu with other_cores >= 0.8" in f.evidence[0] and "ratio_to_median >= 1.2" in f.evidence[0]
    assert got["cpu_contention"].confidence_factors.contested_by == "workload_imbalance"


@pytest.mark.parametrize("fs", [
    [finding("cpu_contention", 1, 0.8), finding("workload_imbalance", 1, 0.69)],    # past the margin
    [finding("cpu_contention", 1, 0.8), finding("workload_imbalance", 2, 0.8)],     # two ranks
    [finding("cpu_contention", 1, 0.8), finding("workload_imbalance", 1, 0.45)],    # one is not reported
])
def test_no_contest_changes_nothing(fs: list[Finding]) -> None:
    assert one_verdict(fs, [host(1, 0.1)], TAX, RES) == fs


@pytest.mark.parametrize(("decider", "message"), [
    ("{fact: host_cpus, where: {other_cores: {gte: 1}}}", "names fact 'host_cpus'"),
    ("{fact: host_cpu, where: {other_core: {gte: 1}}}", r"has no field\(s\) other_core"),
    ("{fact: host_cpu, where: {other_cores: {atleast: 1}}}", "uses an operator other than"),
])
def test_deciding_evidence_must_name_a_fact_and_its_fields(tmp_path: Path, decider: str, message: str) -> None:
    (tmp_path / "taxonomy.yaml").write_text(
        "root_causes:\n  site_cause:\n    category: software\n    component: c\n    question: q?\n"
        f"    runbook: r.md\n    decided_by: [{decider}]\n")
    with pytest.raises(RuleError, match=message):
        load_taxonomy(site_dirs=[tmp_path])
