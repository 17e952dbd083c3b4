"""Conclusions -> findings: merge each cause's conclusions on a rank, reconcile causes on the same rank
as the taxonomy declares, and explain every confidence as a product of printed factors."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from eroica.engine.confidence import confidence_of, presence_of, rescored
from eroica.engine.facts import (
    CategoryExcess,
    ConfigDeviation,
    EvidenceGap,
    Fact,
    FunctionOutlier,
    HardwareSignal,
    RankSlowness,
    StepShare,
)
from eroica.engine.load import WindowData
from eroica.engine.peer import PeerAnalysis
from eroica.engine.rules.conclusion import Conclusion
from eroica.engine.taxonomy import Resolution, TaxonomyEntry
from eroica.engine.verdicts import one_verdict
from eroica.schema.diagnosis import ConfidenceFactors, Finding, FindingCategory, SettingDeviation


def _peer_factor(valid: bool, n: int) -> float:
    if n <= 1:
        return 0.2
    if not valid:
        return 0.5
    return 1.0 if n >= 4 else 0.85


def _merge(conclusions: list[Conclusion]) -> tuple[dict[tuple[str, int], list[Conclusion]],
                                                    dict[tuple[str, int], list[str]], dict[tuple[str, int], set[str]]]:
    """Per (cause, rank): every conclusion that reached it (the surest rule first), every rule, every
    function it matched."""
    reached: dict[tuple[str, int], list[Conclusion]] = {}
    rules: dict[tuple[str, int], list[str]] = {}
    also: dict[tuple[str, int], set[str]] = {}
    for c in sorted(conclusions, key=lambda c: (-c.rule_confidence, str(c.function))):
        key = (c.root_cause, c.rank)
        also.setdefault(key, set()).add(str(c.function))
        rules[key] = sorted(set(rules.get(key, [])) | {c.rule_id})
        reached.setdefault(key, []).append(c)
    return reached, rules, also


def _superseded(reached: dict[tuple[str, int], list[Conclusion]],
                taxonomy: dict[str, TaxonomyEntry]) -> set[tuple[str, int]]:
    """Conclusions a cause on the same rank replaces (taxonomy `superseded_by`; "*": any other cause)."""
    out = set()
    for cause, r in reached:
        by = set(taxonomy[cause].superseded_by) if cause in taxonomy else set()
        if any(k[1] == r and k[0] != cause and ("*" in by or k[0] in by) for k in reached):
            out.add((cause, r))
    return out


def _top_excess(analysis: PeerAnalysis, rank: int) -> tuple[str, Fact] | None:
    outs = [f for f in analysis.facts if isinstance(f, (FunctionOutlier, CategoryExcess)) and f.rank == rank]
    top = max(outs, key=lambda f: f.excess_seconds_per_step, default=None)
    if top is None:
        return None
    return (top.function if isinstance(top, FunctionOutlier) else top.top_function), top


def _located(fact: Fact, facts: list[Fact] | None) -> float:
    """What a fact says the finding costs the job, as a share of a step. A straggler's excess is the
    whole rank's; for a cause whose taxonomy entry says its cost is located (`located_cost`), the
    category or function excess its rule rests on (`facts`) is the part of it the cause costs."""
    ratio = float(getattr(fact, "excess_step_ratio"))
    if facts is None or not isinstance(fact, RankSlowness) or fact.excess_seconds_per_step <= 0:
        return ratio
    parts = [f.excess_seconds_per_step for f in facts
             if isinstance(f, (CategoryExcess, FunctionOutlier)) and f.rank == fact.rank]
    if not parts:
        return ratio
    share = max(0.0, max(parts)) / fact.excess_seconds_per_step
    return ratio * min(share, 1.0)


def _factors(c: Conclusion, facts: list[Fact], slow: RankSlowness | None, analysis: PeerAnalysis,
             coverage_ratio: float, located: bool = False) -> ConfidenceFactors:
    g = next((g for g in analysis.groups if g.name == slow.group), None) if slow else \
        next((g for g in analysis.groups if c.rank in g.ranks), None)
    valid = bool(g and g.valid)
    n = len(g.ranks) if g else 1
    # the cost and consistency of the facts the rule used; a capped link slows everyone alike, so its
    # fact carries its own cost (the group's communication share); an expected-range rule's cost is the
    # share of the step its category holds; a located cause, the part of the rank's excess it holds
    parts = list(c.facts) if located else None
    own = [_located(f, parts) for f in facts if getattr(f, "excess_step_ratio", None) is not None]
    shares = [f.share_ratio for f in facts if isinstance(f, StepShare)]
    excess = max(own or shares, default=slow.excess_step_ratio if slow else 0.0)
    if own and slow is not None:     # a job-wide cost beside the rank's own: the larger is what it costs
        excess = max(excess, _located(slow, parts))
    consistency = next((float(x) for f in facts if (x := getattr(f, "consistency_ratio", None)) is not None), 1.0)
    absolute = c.basis in ("expected_range", "absolute")
    return ConfidenceFactors(
        rule_ratio=c.rule_confidence, prior_rule_id=c.rule_id,
        # 0.5 at a 5% excess of a step, 1.0 from 25%: small deviations are closer to the noise
        deviation_strength_ratio=round(float(0.5 + 0.5 * np.clip((excess - 0.05) / 0.2, 0.0, 1.0)), 4),
        step_consistency_ratio=round(0.6 + 0.4 * consistency, 4),
        # an expected-range rule judges the rank against what a healthy step looks like, not against its
        # peers: their absence does not weaken it (its own prior says how far such a judgement goes)
        peer_group_ratio=1.0 if absolute else _peer_factor(valid, n),
        # missing ranks halve it at most: what the reporting ranks show is still evidence
        coverage_ratio=round(0.5 + 0.5 * coverage_ratio, 4),
        peer_group=(g.reason if g else "no peer group") + {
            "expected_range": "; judged against the expected range",
            "absolute": "; judged on an absolute measurement, not on the peers' work"}.get(c.basis, ""),
        peer_group_valid=valid,
        # a cause concluded without a straggler (its own measurements: a cgroup at its limit, workers busy,
        # foreign CPU) is there whatever it costs: the strength says what it costs, not whether it is there
        strength_is_cost_only=not any(r.startswith("straggler.") for r in (*c.via, c.rule_id)),
    )


def _evidence(c: Conclusion, facts: list[Fact], also: set[str],
              analysis: PeerAnalysis, factors: ConfidenceFactors) -> list[str]:
    ev = [line for f in facts if (line := f.evidence()) is not None]
    if c.hypotheses:
        ev.append("reasoning: " + " -> ".join([str(getattr(f, "kind", "?")) for f in c.hypotheses] + [c.root_cause])
                  + f" (rules {', '.join([*c.via, c.rule_id])})")
    others = sorted(also - {str(c.function), "None"})
    if others:
        ev.append(f"the same cause was also found in: {', '.join(others)}")
    hw = [f for f in analysis.facts if isinstance(f, HardwareSignal) and f.rank == c.rank
          and not 0.6 <= f.ratio_to_median <= 1.6 and abs(f.delta) > 1e-3]
    hw.sort(key=lambda f: -abs(np.log(max(f.ratio_to_median, 1e-3))))
    ev += [line for f in hw[:3] if (line := f.evidence()) not in ev]
    if not factors.peer_group_valid:
        ev.insert(0, f"insufficient peer evidence: {factors.peer_group}")
    return ev


class Argument(NamedTuple):
    """One rule's case for a cause on a rank, scored with its own factors."""

    conclusion: Conclusion
    function: str | None
    facts: list[Fact]
    factors: ConfidenceFactors
    confidence: float


def _argue(c: Conclusion, tax: TaxonomyEntry, analysis: PeerAnalysis, slow: RankSlowness | None,
           coverage_ratio: float) -> Argument | None:
    """One conclusion's case, or None where a missing source its rule needs stands it down."""
    facts = list(c.facts)
    function = c.function
    if function is None and tax.names_top_function and (top := _top_excess(analysis, c.rank)) is not None:
        function, fact = top
        facts.append(fact)
    factors = _factors(c, facts, slow, analysis, coverage_ratio, located=tax.located_cost)
    # the rule's `needs`: evidence this rank could not collect lowers it (a factor of 0 stands it down)
    gaps = [f for f in analysis.facts if isinstance(f, EvidenceGap) and f.rank == c.rank and f.source in c.needs]
    if gaps:
        if c.missing_evidence_factor == 0:
            return None
        factors = factors.model_copy(update={"evidence_gap_ratio": c.missing_evidence_factor,
                                             "evidence_missing": sorted({g.source for g in gaps})})
        facts += [g for g in gaps if g not in facts]
    return Argument(c, function, facts, factors, confidence_of(factors))


def build_findings(w: WindowData, analysis: PeerAnalysis, conclusions: list[Conclusion],
                   taxonomy: dict[str, TaxonomyEntry], resolution: Resolution, coverage_ratio: float,
                   rule_status: dict[str, str] | None = None) -> list[Finding]:
    slow = {f.rank: f for f in analysis.facts if isinstance(f, RankSlowness)}
    reached, rules, also = _merge(conclusions)
    dropped = _superseded(reached, taxonomy)
    findings = []
    for (cause, r), cs in reached.items():
        if (cause, r) in dropped:
            continue
        tax = taxonomy[cause]
        # each rule that reached the cause is a whole argument for it: the finding stands on the
        # strongest, after its own factors (an absolute measurement is not weakened by peers that
        # are no peers, while a rule that compares the rank with them is)
        argued = [a for c in cs if (a := _argue(c, tax, analysis, slow.get(r), coverage_ratio)) is not None]
        if not argued:
            continue
        best = max(argued, key=lambda a: a.confidence)
        argued = [best, *(a for a in argued if a is not best)]
        c, function, facts, factors, conf = best
        evidence = _evidence(c, facts, also[(cause, r)], analysis, factors)
        # the other arguments' measurements are evidence too, after the one the confidence rests on
        evidence += list(dict.fromkeys(line for a in argued[1:] for f in a.facts
                                       if (line := f.evidence()) is not None and line not in evidence))
        s = slow.get(r)
        row = w.columns.row.get(r)
        findings.append(Finding(
            root_cause=cause, category=FindingCategory(tax.category), component=tax.component,
            ranks=[r], hosts=[w.columns.hostname[row]] if row is not None else [], function=function,
            devices=[_device(w, row)] if row is not None else [],
            confidence=conf, confidence_factors=factors, presence_confidence=presence_of(factors),
            summary=" ".join(c.summary.split()),
            evidence=evidence,
            rule_ids=rules[(cause, r)], derived_via=list(c.via),
            rule_status={k: (rule_status or {}).get(k, "?") for k in [*rules[(cause, r)], *c.via]},
            fix_template=c.fix_template, runbook=tax.runbook,
            insufficient_peer_evidence=not factors.peer_group_valid,
            excess_seconds_per_step=round(s.excess_seconds_per_step, 6) if s else 0.0,
            # the settings any argument rests on (a draft changes them, whichever argument is strongest)
            settings=list(dict.fromkeys(SettingDeviation(key=f.key, value=f.value, peer_value=f.peer_value)
                                        for a in argued for f in a.facts if isinstance(f, ConfigDeviation))),
            sites={k[5:]: v for k, v in (w.columns.config[row] if row is not None else ()) if k.startswith("site.")},
        ))
    findings = explain_away(findings, taxonomy, resolution)
    findings = _host_wide(_same_cause(one_verdict(findings, analysis.facts, taxonomy, resolution)), w)
    findings.sort(key=lambda f: (-f.confidence, -f.excess_seconds_per_step))
    return findings


def _device(w: WindowData, row: int) -> str:
    c = w.columns
    return f"{c.hostname[row]}/{c.device[row] if row < len(c.device) else 'cpu'}"


def _host_wide(findings: list[Finding], w: WindowData) -> list[Finding]:
    """A cause found on every rank of one host (a host of two or more ranks, on a job of more than one
    host) is that host's problem: one finding for the host, not one per rank. A cause on some of a
    host's ranks stays theirs."""
    c = w.columns
    on_host: dict[str, set[int]] = {}
    for r, h in zip(c.ranks, c.hostname):
        on_host.setdefault(h, set()).add(r)
    if len(on_host) < 2:
        return findings
    out: list[Finding] = []
    by: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        if len(f.hosts) == 1 and len(on_host.get(f.hosts[0], ())) >= 2:
            by.setdefault((f.root_cause, f.hosts[0]), []).append(f)
        else:
            out.append(f)
    for (_, host), fs in by.items():
        ranks = sorted({r for f in fs for r in f.ranks})
        if set(ranks) != on_host[host]:
            out.extend(fs)
            continue
        fs.sort(key=lambda f: (-f.confidence, f.ranks))
        top = fs[0]
        evidence = [f"every rank of host {host} ({', '.join(map(str, ranks))}) shows it: the host's problem"]
        for f in fs:
            evidence += [e for e in f.evidence if e not in evidence]
        out.append(top.model_copy(update={
            "ranks": ranks, "scope": "host", "evidence": evidence,
            "devices": sorted({d for f in fs for d in f.devices}),
            "summary": f"host {host}: {top.summary}",
            "excess_seconds_per_step": max(f.excess_seconds_per_step for f in fs),
            "rule_ids": sorted({r for f in fs for r in f.rule_ids}),
            "rule_status": {k: v for f in fs for k, v in f.rule_status.items()},
            "settings": [s for f in fs for s in f.settings]}))
    return out


def _same_cause(findings: list[Finding]) -> list[Finding]:
    """Several ranks late for the same cause in the same function are one finding (one ticket, one
    fix), at the confidence of the surest; each rank's own evidence is kept, its rank named."""
    groups: dict[tuple[str, str | None], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.root_cause, f.function), []).append(f)
    out = []
    for fs in groups.values():
        if len(fs) == 1:
            out.append(fs[0])
            continue
        fs.sort(key=lambda f: (-f.confidence, f.ranks))
        top = fs[0]
        ranks = sorted({r for f in fs for r in f.ranks})
        evidence = [f"ranks {', '.join(map(str, ranks))} show the same cause in {top.function}"]
        for f in fs:
            evidence += [line if line.startswith(f"rank {f.ranks[0]} ") else f"rank {f.ranks[0]}: {line}"
                         for line in f.evidence]
        out.append(top.model_copy(update={
            "ranks": ranks, "hosts": sorted({h for f in fs for h in f.hosts}), "evidence": evidence,
            "devices": sorted({d for f in fs for d in f.devices}),
            "excess_seconds_per_step": max(f.excess_seconds_per_step for f in fs),
            "rule_ids": sorted({r for f in fs for r in f.rule_ids}),
            "rule_status": {k: v for f in fs for k, v in f.rule_status.items()},
            "settings": [s for f in fs for s in f.settings]}))
    return out


def explain_away(findings: list[Finding], taxonomy: dict[str, TaxonomyEntry], resolution: Resolution) -> list[Finding]:
    """A finding whose cause the taxonomy says is explained by another cause found on the same ranks
    (`explained_by`), or a generic one beside a specific cause at least as confident, is kept at the
    declared factor; the factor and the cause that explained it away are in its confidence factors."""
    out = []
    for f in findings:
        tax = taxonomy.get(f.root_cause)
        better = [] if tax is None else [
            g for g in findings if g is not f and set(g.ranks) == set(f.ranks) and (
                (tax.generic and not getattr(taxonomy.get(g.root_cause), "generic", False)
                 and g.confidence >= f.confidence) or g.root_cause in tax.explained_by)]
        if better:
            f = rescored(f, f"explained away by {better[0].root_cause} on the same rank",
                         explained_away_ratio=resolution.explained_away_factor,
                         explained_away_by=better[0].root_cause)
        out.append(f)
    return out


def unhealthy(findings: list[Finding], taxonomy: dict[str, TaxonomyEntry], resolution: Resolution) -> bool:
    """A finding at its cause's `unhealthy_at` (a clearly slow rank nothing explains counts at less)."""
    def at(f: Finding) -> float:
        t = taxonomy.get(f.root_cause)
        return t.unhealthy_at if t is not None and t.unhealthy_at is not None else resolution.unhealthy_at
    return any(f.confidence >= at(f) for f in findings)
