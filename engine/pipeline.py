"""Orchestrates one diagnosis: load -> peer comparison -> rule engine -> findings with explained confidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eroica.engine import VERSION
from eroica.engine.confidence import rescored
from eroica.engine.findings import build_findings, unhealthy
from eroica.engine.hang import load_snapshots, localize_documents
from eroica.engine.history import (
    add_gaps,
    mark_history,
    mark_standing,
    mark_susceptible,
    start_step,
    summarize,
    with_findings,
)
from eroica.engine.job_story import story
from eroica.engine.load import WindowData, load_run
from eroica.engine.peer import PeerAnalysis, analyze
from eroica.engine.report_data import add_report_data, heatmap, shared_costs, step_series
from eroica.engine.rules.ir import RuleIR
from eroica.engine.rules.layers import KnowledgeSpec, compiled, compiled_with_notes
from eroica.engine.rules.runner import run_rules
from eroica.engine.taxonomy import (
    Resolution,
    TaxonomyEntry,
    load_coverage_floor,
    load_resolution,
    load_taxonomy,
)
from eroica.schema.diagnosis import (
    Coverage,
    Diagnosis,
    Finding,
    PeerGroupInfo,
    StepSummary,
    WindowDiagnosis,
    WindowHistory,
)
from eroica.schema.hang import HangSnapshot


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


@dataclass
class DiagnoseOptions:
    knowledge: KnowledgeSpec = field(default_factory=KnowledgeSpec)   # shipped, then a site's layers
    window: str | None = None
    in_process: bool = False
    doc_cache: int = 4096                      # parsed documents kept in memory; others are read again
    workers: int = 1                           # processes that parse a wide window (forked: not in a server)

    @property
    def site_dirs(self) -> list[Path]:
        return [d for d in self.knowledge.site_dirs if d.is_dir()]


def compile_knowledge(opts: DiagnoseOptions) -> list[RuleIR]:
    """The rules a diagnosis runs: the knowledge's one compile path (eroica.engine.rules.layers)."""
    return compiled(opts.knowledge)


def diagnose(run_dir: Path, opts: DiagnoseOptions | None = None) -> Diagnosis:
    """A run directory's diagnosis: its windows' documents and its latest hang, read by the run
    directory adapter (eroica.engine.load) and diagnosed as documents."""
    opts = opts or DiagnoseOptions()
    windows = load_run(Path(run_dir), opts.window, opts.doc_cache, opts.workers)
    snaps = load_snapshots(Path(run_dir)) if Path(run_dir).is_dir() else []
    return diagnose_documents(windows, opts=opts, hang_snapshots=snaps, run=str(run_dir))


def analyze_windows(windows: Sequence[WindowData], history: Sequence[WindowHistory] = ()) -> dict[str, PeerAnalysis]:
    """Each window's peer analysis with the facts the rules see: the peer comparison's, marked with
    the job's history (a difference seen while the job was healthy), and the suspects' evidence gaps."""
    analyses = {w.window_id: analyze(w) for w in windows}
    known = list(history)
    for w in sorted(windows, key=start_step):          # by step number: each sees those before it
        a = analyses[w.window_id]
        mark_history(w, a, known)
        add_gaps(w, a)
        a.summary = summarize(w, a, ())         # once per window: its findings are added when ruled
        known.append(a.summary)
    return analyses


def diagnose_documents(windows: Sequence[WindowData], history: Sequence[WindowHistory] = (),
                       hang_snapshots: Sequence[HangSnapshot | dict[str, Any]] = (),
                       opts: DiagnoseOptions | None = None, run: str = "") -> Diagnosis:
    """The engine's entry point: windows of pattern documents (`window_of_packs` makes one from their
    documents), the job's history as the `WindowHistory` summaries of its earlier windows (never
    their documents), and a hang's snapshots. Each window's diagnosis carries its own summary for
    the windows after it. Windows given together inform each other as history would."""
    opts = opts or DiagnoseOptions()
    # refused with file and line as `eroica rules lint` refuses it; the notes say what a site changed
    rules, notes = compiled_with_notes(opts.knowledge)
    taxonomy = load_taxonomy(site_dirs=opts.site_dirs)
    resolution = load_resolution()
    status = {r.id: r.status for r in rules}
    analyses = analyze_windows(windows, history)
    facts = {wid: list(a.facts) for wid, a in analyses.items() if a.facts}
    results = run_rules(rules, facts, in_process=opts.in_process, site_dirs=opts.site_dirs) if facts else {}
    conclusions = {w: r[0] for w, r in results.items()}
    fired = {w: sorted({c.rule_id for c in r[0]} | {d.rule_id for d in r[1]}) for w, r in results.items()}
    out: list[WindowDiagnosis] = []
    floor = load_coverage_floor()
    for w in windows:
        a = analyses[w.window_id]
        steps = _steps(w, a)
        coverage = _coverage(w)
        findings = add_report_data(build_findings(w, a, conclusions.get(w.window_id, []), taxonomy, resolution,
                                         coverage.coverage_ratio, status), w, a, steps.during_median_seconds,
                                   steps.before_median_seconds)
        findings = shared_costs(sorted(mark_susceptible(a, mark_standing(w, findings)), key=_report_order))
        c = w.columns
        why_not = floor.why_not(len(coverage.ranks_reported), coverage.world_size)
        out.append(
            WindowDiagnosis(
                window=w.window_id,
                start_step=int(c.start_step[0]) if c.ranks else 0,
                end_step=int(c.end_step[0]) if c.ranks else 0,
                trigger=c.trigger[0] if c.ranks else "not read",
                findings=findings, coverage=coverage, steps=steps,
                heatmap=heatmap(w, a), step_series=step_series(w),
                raw_traces={str(r): p for r, p in sorted(w.raw_traces.items())},
                peer_groups=[PeerGroupInfo(name=g.name, ranks=g.ranks, valid=g.valid, reason=g.reason)
                             for g in a.groups],
                # a slow rank nothing explains is not healthy, whatever the confidence of its cause
                # (taxonomy: unhealthy_at); and healthy needs evidence: below the coverage floor nothing
                # is concluded
                healthy=why_not is None and not unhealthy(findings, taxonomy, resolution),
                diagnosable=why_not is None, not_diagnosable_reason=why_not,
                history=with_findings(a.summary or summarize(w, a, ()), findings),
                rules_fired=fired.get(w.window_id, []),
            )
        )
    windows_out = _across_windows(out, history, taxonomy, resolution)
    return Diagnosis(run_dir=run, eroica_version=VERSION, rules_loaded=len(rules), knowledge=notes,
                     windows=windows_out, story=story(windows_out),
                     hang=localize_documents(hang_snapshots, rules, taxonomy) if hang_snapshots else None)


def _report_order(f: Finding) -> tuple[float, float]:
    """Surest first, then costliest."""
    return -f.confidence, -f.excess_seconds_per_step


def _across_windows(windows: list[WindowDiagnosis], history: Sequence[WindowHistory],
                    taxonomy: dict[str, TaxonomyEntry], resolution: Resolution) -> list[WindowDiagnosis]:
    """A cause that recurs on the same ranks window after window (among those diagnosed together
    and the earlier ones of `history`) is surer than a one-off. Counted from the cause's first window:
    the windows before it saw the job before the cause began, not a cause that failed to recur."""
    if len(windows) + len(history) <= 1:
        return windows
    by_step = sorted([(w.start_step, {(f.root_cause, tuple(f.ranks)) for f in w.findings}) for w in windows]
                     + [(h.start_step, {(f.root_cause, tuple(f.ranks)) for f in h.findings}) for h in history],
                     key=lambda x: x[0])
    seen: dict[tuple[str, tuple[int, ...]], int] = {}
    since: dict[tuple[str, tuple[int, ...]], int] = {}
    for i, (_, keys) in enumerate(by_step):
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
            since.setdefault(key, len(by_step) - i)
    out = []
    for w in windows:
        findings = []
        for f in w.findings:
            key = (f.root_cause, tuple(f.ranks))
            k, n = seen[key], since[key]
            findings.append(rescored(f, window_consistency_ratio=round(0.8 + 0.2 * k / n, 4),
                                     windows_seen_total=k, windows_total=n))
        # the order may change: which finding carries an excess is decided again
        unmarked = [f.model_copy(update={"cost": f.cost.model_copy(update={"same_excess_as": None})})
                    if f.cost is not None else f for f in findings]
        findings = shared_costs(sorted(unmarked, key=_report_order))
        out.append(w.model_copy(update={
            "findings": findings, "healthy": w.diagnosable and not unhealthy(findings, taxonomy, resolution)}))
    return out
