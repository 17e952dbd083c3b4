"""Orchestrates one diagnosis: load -> peer comparison -> rule engine -> findings with explained confidence."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from eroica.engine.diagnosis import (
    ConfidenceFactors,
    Coverage,
    Diagnosis,
    Finding,
    FindingCategory,
    PeerGroupInfo,
    SettingDeviation,
    StepSummary,
    WindowDiagnosis,
)
from eroica.engine.errors import RuleError
from eroica.engine.facts import CategoryExcess, FunctionOutlier, HardwareSignal, RankSlowness
from eroica.engine.history import mark_history
from eroica.engine.load import WindowData, load_run
from eroica.engine.peer import PeerAnalysis, analyze
from eroica.engine.report_data import enrich, heatmap, step_series
from eroica.engine.rules.compiler import RuleIR, compile_rules
from eroica.engine.rules.loader import builtin_knowledge_dir, load_overrides, load_rules, rule_files
from eroica.engine.rules.runner import evaluate

FALLBACK = "unknown"          # the root cause of a slow rank that no other rule explains
UNEXPLAINED_UNHEALTHY = 0.3   # an unexplained slow rank at this confidence makes a window not healthy


@dataclass(frozen=True)
class TaxonomyEntry:
    category: str
    component: str
    question: str
    runbook: str
    generic: bool = False     # a catch-all explanation, explained away by a specific one
    explained_by: tuple[str, ...] = ()   # causes that explain this one away on the same rank
EXPLAINED_AWAY_FACTOR = 0.5


@lru_cache(maxsize=8)
def _taxonomy_doc(path: Path) -> dict[str, Any]:
    """The shipped taxonomy file, parsed once per process (root causes and the coverage floor)."""
    return dict(yaml.safe_load(path.read_text()))


def load_taxonomy(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None) -> dict[str, TaxonomyEntry]:
    """The shipped taxonomy, plus the root causes a site adds in `<site dir>/taxonomy.yaml` (new ids
    only: a shipped one is changed through the rules and overrides, not redefined)."""
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    out = {k: TaxonomyEntry(**{**v, "explained_by": tuple(v.get("explained_by", ()))})
           for k, v in data["root_causes"].items()}
    for d in site_dirs or []:
        f = Path(d) / "taxonomy.yaml"
        if not f.exists():
            continue
        try:
            site = (yaml.safe_load(f.read_text()) or {}).get("root_causes") or {}
        except yaml.YAMLError as exc:
            raise RuleError([f"{f}: not valid YAML: {exc}"]) from exc
        problems = []
        for k, v in site.items():
            if k in out:
                problems.append(f"{f}: root cause {k!r} is already in the taxonomy; a site adds new ids")
                continue
            try:
                out[k] = TaxonomyEntry(**{**v, "explained_by": tuple(v.get("explained_by", ()))})
            except TypeError as exc:
                problems.append(f"{f}: root cause {k!r}: {exc}; it needs category, component, question, runbook")
        if problems:
            raise RuleError(problems)
    return out


@dataclass(frozen=True)
class CoverageFloor:
    min_ranks: int = 3
    min_ratio: float = 0.5

    def why_not(self, reported: int, world: int) -> str | None:
        """Why a window with `reported` of `world` ranks cannot be diagnosed (None: it can)."""
        if reported == 0:
            return "no rank's patterns could be read (see the file problems): nothing to compare"
        if world >= self.min_ranks and reported < self.min_ranks:
            return f"only {reported} of {world} ranks reported (the floor is {self.min_ranks})"
        if world and reported / world < self.min_ratio:
            return (f"only {reported} of {world} ranks reported ({reported / world:.0%}, the floor is "
                    f"{self.min_ratio:.0%}): what the others did is unknown")
        return None


def load_coverage_floor(knowledge_dir: Path | None = None) -> CoverageFloor:
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    return CoverageFloor(**(data.get("coverage_floor") or {}))


def _version() -> str:
    try:
        return metadata.version("eroica")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _peer_factor(valid: bool, n: int) -> float:
    if n <= 1:
        return 0.2
    if not valid:
        return 0.5
    return 1.0 if n >= 4 else 0.85


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def _evidence(facts: list[dict[str, Any]], analysis: PeerAnalysis, rank: int) -> list[str]:
    out: list[str] = []
    for f in facts:
        k = f.get("kind")
        if k == "rank_slowness":
            out.append(
                f"rank {rank} is busy {_ms(f['busy_seconds_per_step'])}/step against a peer median of "
                f"{_ms(f['peer_median_busy_seconds_per_step'])} (+{f['excess_step_ratio']:.0%} of a step); it waits "
                f"{f['comm_wait_ratio_to_median']:.2f}x the peers' communication time"
                + (": the others wait for it" if f.get("least_waiting") else "")
            )
        elif k == "category_excess":
            mr = f.get("metric_ratio_to_median")
            out.append(
                f"{f['category']} holds the critical path {_ms(f['seconds_per_step'])}/step vs "
                f"{_ms(f['peer_median_seconds_per_step'])} on peers, explaining {f['explains_ratio']:.0%} of the "
                f"excess (top: {f['top_function']})" + (f"; CPU rate {mr:.2f}x the peers'" if mr is not None else "")
            )
        elif k == "function_outlier":
            out.append(
                f"{f['function']}: {_ms(f['seconds_per_step'])}/step vs {_ms(f['peer_median_seconds_per_step'])} "
                f"(x{f['ratio_to_median']:.1f}), explains {f['explains_ratio']:.0%}"
            )
        elif k == "step_spike":
            sig = [f"{n.split('_ratio')[0].replace('_', ' ')} {f[n]:.0%}" for n in
                   ("io_wait_ratio", "runqueue_wait_ratio", "cpu_util_ratio") if f.get(n) is not None]
            out.append(
                f"step {f['step_number']}: {f['step_seconds']:.2f} s against a median of "
                f"{_ms(f['median_step_seconds'])}; rank {rank} busy {f['busy_seconds']:.2f} s of it (peers "
                f"{_ms(f['peer_median_busy_seconds'])}), {f['function_seconds']:.2f} s in {f['function']}"
                + (f"; its thread in that step: {', '.join(sig)}" if sig else "")
            )
        elif k == "host_cpu":
            out.append(
                f"host {f['host']}: {f['busy_cores']:.2f} of {f['cores_total']} cores busy, the job's "
                f"{f['ranks_on_host']} rank(s) use {f['job_cores']:.2f}, other processes {f['other_cores']:.2f}"
            )
        elif k == "job_slowdown":
            out.append(
                f"the job's step: {_ms(f['step_seconds'])} against {_ms(f['baseline_step_seconds'])} before the "
                f"window (x{f['step_ratio_to_baseline']:.2f}); {f['ranks_standing_out']} rank(s) stand out in busy time"
            )
        elif k == "hw_signal":
            out.append(f"{f['signal']} = {f['value']:.3g} (peer median {f['peer_median']:.3g})")
        elif k == "link_signature":
            out.append(
                f"link byte rate during {f['function']}: mean {f['mean_bytes_per_second']:.3g} B/s, spread "
                f"{f['cv_ratio']:.2f} of the mean vs {f['peer_median_cv_ratio']:.2f} on peers (steady = capped); "
                f"it waits {f['comm_wait_ratio_to_median']:.2f}x the peers' communication time (not a late rank)"
            )
    return out


def _facts_for_rules(analysis: PeerAnalysis) -> list[dict[str, Any]]:
    return [f.model_dump(mode="json") for f in analysis.facts]


def _coverage(w: WindowData) -> Coverage:
    c = w.columns
    world = w.world_size or len(c.ranks)
    reported = list(c.ranks)
    missing = sorted(set(range(world)) - set(reported))
    gaps = sorted({f"rank {r}: {src}: {why}" for r, gs in zip(c.ranks, c.gaps) for src, why in gs})
    sizes = c.overhead["pattern_bytes"]
    ov: dict[str, float] = {}
    if reported:
        calls = float(c.overhead["detector_calls_total"].sum()) or 1
        ov = {
            "detector_seconds_per_step": round(float(c.overhead["detector_seconds_total"].sum()) / calls, 7),
            "sampler_cpu_seconds_median": round(float(np.median(c.overhead["sampler_cpu_seconds"])), 4),
            "summarize_seconds_median": round(float(np.median(c.overhead["summarize_seconds"])), 4),
            "raw_events_median": float(np.median(c.overhead["raw_events_total"])),
        }
    return Coverage(
        world_size=world, ranks_reported=reported, ranks_missing=missing,
        coverage_ratio=round(len(reported) / world, 4) if world else 0.0,
        file_problems=[str(p) for p in w.problems], collector_gaps=gaps,
        window_steps=int(c.n_steps.max()) if reported else 0,
        pattern_bytes_per_rank_median=int(np.median(sizes)) if len(sizes) else 0, collector_overhead=ov,
        privacy_levels=sorted(set(c.privacy)),
    )


def _steps(w: WindowData, analysis: PeerAnalysis) -> StepSummary:
    c = w.columns
    before = c.baseline[~np.isnan(c.baseline)]
    during = c.step[np.arange(c.step.shape[1])[None, :] < c.n_steps[:, None]]
    b = float(np.median(before)) if len(before) else None
    d_ = float(np.median(during)) if len(during) else None
    return StepSummary(
        before_median_seconds=None if b is None else round(b, 6),
        during_median_seconds=None if d_ is None else round(d_, 6),
        slowdown_ratio=round(d_ / b, 3) if b and d_ else None,
        per_rank_during_seconds={str(r): round(row.step_seconds, 6) for r, row in sorted(analysis.rows.items())},
        per_rank_busy_seconds={str(r): round(row.busy_seconds, 6) for r, row in sorted(analysis.rows.items())},
        per_rank_comm_wait_seconds={
            str(r): round(row.comm_wait_seconds, 6) for r, row in sorted(analysis.rows.items())
        },
    )


def build_findings(
    w: WindowData, analysis: PeerAnalysis, conclusions: list[dict[str, Any]], taxonomy: dict[str, TaxonomyEntry]
) -> list[Finding]:
    slow = {f.rank: f for f in analysis.facts if isinstance(f, RankSlowness)}
    groups = {g.name: g for g in analysis.groups}
    cov = _coverage(w).coverage_ratio
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    also: dict[tuple[str, int], set[str]] = {}
    for c in sorted(conclusions, key=lambda c: (-c["confidence"], str(c.get("function")))):
        also.setdefault((c["root_cause"], int(c["rank"])), set()).add(str(c.get("function")))
        key = (c["root_cause"], int(c["rank"]))
        prev = merged.get(key)
        if prev is None or c["confidence"] > prev["confidence"]:
            rules = sorted(set((prev or {}).get("rule_ids", [])) | {c["rule_id"]})
            merged[key] = dict(c, rule_ids=rules)
        else:
            prev["rule_ids"] = sorted(set(prev["rule_ids"]) | {c["rule_id"]})
    # `unknown` (rule straggler.unexplained) is the fallback: it names a slow rank that no other rule
    # explains, so it is dropped wherever another finding names the same rank
    for cause, r in list(merged):
        if cause == FALLBACK and any(k[1] == r and k[0] != FALLBACK for k in merged):
            del merged[(cause, r)]
        elif cause == FALLBACK and not merged[(cause, r)].get("function"):
            outs = [f for f in analysis.facts if isinstance(f, (FunctionOutlier, CategoryExcess)) and f.rank == r]
            top = max(outs, key=lambda f: f.excess_seconds_per_step, default=None)
            if top is not None:
                fn = top.function if isinstance(top, FunctionOutlier) else top.top_function
                merged[(cause, r)] = dict(merged[(cause, r)], function=fn,
                                          facts=[*merged[(cause, r)]["facts"], top.model_dump(mode="json")])
    findings = []
    for (cause, r), c in merged.items():
        s = slow.get(r)
        gname = s.group if s else next((g.name for g in analysis.groups if r in g.ranks), "worker")
        g = groups.get(gname)
        valid = bool(g and g.valid)
        n = len(g.ranks) if g else 1
        # the cost and consistency of the facts the rule used; a capped link slows everyone alike,
        # so its fact carries its own cost (the group's communication share)
        own = [f for f in c["facts"] if f.get("excess_step_ratio") is not None]
        excess = max((f["excess_step_ratio"] for f in own), default=s.excess_step_ratio if s else 0.0)
        consistency = next((f["consistency_ratio"] for f in c["facts"] if f.get("consistency_ratio") is not None), 1.0)
        factors = ConfidenceFactors(
            rule_ratio=c["confidence"],
            # 0.5 at a 5% excess of a step, 1.0 from 25%: small deviations are closer to the noise
            deviation_strength_ratio=round(float(0.5 + 0.5 * np.clip((excess - 0.05) / 0.2, 0.0, 1.0)), 4),
            step_consistency_ratio=round(0.6 + 0.4 * consistency, 4),
            peer_group_ratio=_peer_factor(valid, n),
            # missing ranks halve it at most: what the reporting ranks show is still evidence
            coverage_ratio=round(0.5 + 0.5 * cov, 4),
            peer_group=g.reason if g else "no peer group",
            peer_group_valid=valid,
        )
        conf = (factors.rule_ratio * factors.deviation_strength_ratio * factors.step_consistency_ratio
                * factors.peer_group_ratio * factors.coverage_ratio)
        tax = taxonomy.get(cause) or taxonomy[FALLBACK]
        ev = _evidence(c["facts"], analysis, r)
        others = sorted(also.get((cause, r), set()) - {str(c.get("function")), "None"})
        if others:
            ev.append(f"the same rule also matched: {', '.join(others)}")
        hw = [f for f in analysis.facts if isinstance(f, HardwareSignal) and f.rank == r
              and not 0.6 <= f.ratio_to_median <= 1.6 and abs(f.delta) > 1e-3]
        hw.sort(key=lambda f: -abs(np.log(max(f.ratio_to_median, 1e-3))))
        ev_hw = [f"{f.signal} = {f.value:.3g} (peer median {f.peer_median:.3g})" for f in hw[:3]]
        ev += [e for e in ev_hw if e not in ev]
        if not valid:
            ev.insert(0, f"insufficient peer evidence: {factors.peer_group}")
        row = w.columns.row.get(r)
        findings.append(
            Finding(
                root_cause=cause, category=FindingCategory(tax.category), component=tax.component,
                ranks=[r], hosts=[w.columns.hostname[row]] if row is not None else [], function=c.get("function"),
                confidence=round(float(conf), 4), confidence_factors=factors, summary=" ".join(c["summary"].split()),
                evidence=ev, rule_ids=c["rule_ids"], fix_template=c.get("fix_template"), runbook=tax.runbook,
                insufficient_peer_evidence=not valid,
                excess_seconds_per_step=round(s.excess_seconds_per_step, 6) if s else 0.0,
                settings=[SettingDeviation(key=f["key"], value=f["value"], peer_value=f["peer_value"])
                          for f in c["facts"] if f.get("kind") == "config_deviation"],
            )
        )
    findings = _same_cause(_explain_away(findings, taxonomy))
    findings.sort(key=lambda f: (-f.confidence, -f.excess_seconds_per_step))
    return findings


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
            "excess_seconds_per_step": max(f.excess_seconds_per_step for f in fs),
            "rule_ids": sorted({r for f in fs for r in f.rule_ids}),
            "settings": [s for f in fs for s in f.settings]}))
    return out


def _explain_away(findings: list[Finding], taxonomy: dict[str, TaxonomyEntry]) -> list[Finding]:
    """A generic explanation (more work per step, unknown) of a rank that a specific cause also
    explains at least as confidently is kept, but at half its confidence and saying why."""
    out = []
    for f in findings:
        tax = taxonomy.get(f.root_cause)
        if tax is None:
            out.append(f)
            continue
        better = [g for g in findings if g is not f and set(g.ranks) == set(f.ranks) and (
            (tax.generic and not getattr(taxonomy.get(g.root_cause), "generic", False)
             and g.confidence >= f.confidence) or g.root_cause in tax.explained_by)]
        if better:
            f = f.model_copy(update={
                "confidence": round(f.confidence * EXPLAINED_AWAY_FACTOR, 4),
                "evidence": [f"explained away by {better[0].root_cause} on the same rank", *f.evidence],
            })
        out.append(f)
    return out


@dataclass
class DiagnoseOptions:
    rule_paths: list[Path] | None = None       # default: the shipped knowledge/rules
    extra_rule_dirs: list[Path] | None = None  # a site's own rules, kept outside the repo
    override_files: list[Path] | None = None
    window: str | None = None
    knowledge_dirs: list[Path] | None = None   # a site's knowledge: rules/, overrides/*.yaml, taxonomy.yaml
    in_process: bool = False
    doc_cache: int = 4096                      # parsed documents kept in memory; others are read again


def compile_knowledge(opts: DiagnoseOptions) -> list[RuleIR]:
    paths = list(opts.rule_paths or [builtin_knowledge_dir() / "rules"]) + list(opts.extra_rule_dirs or [])
    override_files = list(opts.override_files or [])
    for k in opts.knowledge_dirs or []:
        if (Path(k) / "rules").is_dir():
            paths.append(Path(k) / "rules")
        override_files.extend(sorted((Path(k) / "overrides").glob("*.yaml")))
    rule_files(paths)  # raises a clear error for missing paths
    overrides = load_overrides(override_files)
    return compile_rules(load_rules(paths, overrides))


def diagnose(run_dir: Path, opts: DiagnoseOptions | None = None) -> Diagnosis:
    opts = opts or DiagnoseOptions()
    rules = compile_knowledge(opts)
    taxonomy = load_taxonomy(site_dirs=opts.knowledge_dirs)
    windows = load_run(Path(run_dir), opts.window, opts.doc_cache)
    analyses = {w.window_id: analyze(w) for w in windows}
    mark_history(windows, analyses)
    facts: dict[str, list[dict[str, Any]]] = {wid: _facts_for_rules(a) for wid, a in analyses.items()}
    conclusions = evaluate(rules, {k: v for k, v in facts.items() if v}, in_process=opts.in_process) if any(
        facts.values()) else {}
    out: list[WindowDiagnosis] = []
    floor = load_coverage_floor()
    for w in windows:
        a = analyses[w.window_id]
        steps = _steps(w, a)
        findings = enrich(build_findings(w, a, conclusions.get(w.window_id, []), taxonomy), w, a,
                          steps.during_median_seconds)
        c = w.columns
        coverage = _coverage(w)
        why_not = floor.why_not(len(coverage.ranks_reported), coverage.world_size)
        out.append(
            WindowDiagnosis(
                window=w.window_id,
                start_step=int(c.start_step[0]) if c.ranks else 0,
                end_step=int(c.end_step[0]) if c.ranks else 0,
                trigger=c.trigger[0] if c.ranks else "unknown",
                findings=findings, coverage=coverage, steps=steps,
                heatmap=heatmap(w, a), step_series=step_series(w),
                raw_traces={str(r): p for r, p in sorted(w.raw_traces.items())},
                peer_groups=[PeerGroupInfo(name=g.name, ranks=g.ranks, valid=g.valid, reason=g.reason)
                             for g in a.groups],
                # a slow rank nothing explains is not healthy, whatever the confidence of its cause;
                # and healthy needs evidence: below the coverage floor nothing is concluded
                healthy=why_not is None and _healthy(findings),
                diagnosable=why_not is None, not_diagnosable_reason=why_not,
            )
        )
    return Diagnosis(run_dir=str(run_dir), eroica_version=_version(), rules_loaded=len(rules),
                     windows=_across_windows(out))


def _healthy(findings: list[Finding]) -> bool:
    """No confident finding, and no clearly slow rank that nothing explains."""
    return not any(f.confidence >= 0.5 or (f.root_cause == FALLBACK and f.confidence >= UNEXPLAINED_UNHEALTHY)
                   for f in findings)


def _across_windows(windows: list[WindowDiagnosis]) -> list[WindowDiagnosis]:
    """A cause that recurs on the same ranks window after window is surer than a one-off."""
    n = len(windows)
    if n <= 1:
        return windows
    seen: dict[tuple[str, tuple[int, ...]], int] = {}
    for w in windows:
        for key in {(f.root_cause, tuple(f.ranks)) for f in w.findings}:
            seen[key] = seen.get(key, 0) + 1
    out = []
    for w in windows:
        findings = []
        for f in w.findings:
            k = seen[(f.root_cause, tuple(f.ranks))]
            factor = round(0.8 + 0.2 * k / n, 4)
            cf = f.confidence_factors.model_copy(update={
                "window_consistency_ratio": factor, "windows_seen_total": k, "windows_total": n})
            findings.append(f.model_copy(update={"confidence": round(f.confidence * factor, 4),
                                                 "confidence_factors": cf}))
        findings.sort(key=lambda f: (-f.confidence, -f.excess_seconds_per_step))
        out.append(w.model_copy(update={"findings": findings, "healthy": w.diagnosable and _healthy(findings)}))
    return out

