"""Replay recorded incidents through the engine and score diagnosis yield.

An incident is `incidents/<ID>/` with `patterns/<window>/rank-<R>.json`, `context.yaml` and
`expected.yaml`:

    expect:                     # each must be matched by a finding at >= min_confidence
      - {root_cause: dataloader_stall, ranks: [1], function_contains: DataLoader}
      - {root_cause: transient_stall, ranks: [3], min_confidence: 0.3, max_confidence: 0.5}
    min_confidence: 0.5
    top: true                   # the first expectation must be the top finding
    must_not:                   # no finding at >= min_confidence may match one of these
      - {ranks_other_than: [1]}

A healthy incident has `expect: []` (then any finding at >= min_confidence is a false finding).
An incident may hold several windows of one job (`context.yaml` `injected.from_step` says when the
fault began): they are diagnosed together, the first window at or after the onset is judged, and
the windows before it are the job's healthy past. `incidents/heldout/` holds incidents of another
job, never tuned on; `eroica eval` scores it apart. A held-out case read before a change (its
diagnosis looked at, a miss explained, a rule's test written from its numbers) or recorded for one
says so (`seen: true` with `seen_why:`): the unseen cases' yield is the headline, the seen ones' apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eroica.engine.errors import EngineError, RunDirError
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.priors import PriorFit, PriorSample, fit_priors
from eroica.engine.rules.loader import load_rules
from eroica.engine.rules.source import SAFE_LOADER
from eroica.schema.diagnosis import Finding


class Expectation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    root_cause: str
    ranks: list[int]
    function_contains: str | None = None
    min_confidence: float | None = Field(None, ge=0, le=1)   # this one only; default: the incident's
    max_confidence: float | None = Field(None, ge=0, le=1)   # e.g. a one-off must stay below 0.5


class MustNot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    ranks_other_than: list[int] | None = None
    root_cause: str | None = None


class Expected(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    expect: list[Expectation] = Field(default_factory=list)
    min_confidence: float = Field(0.5, ge=0, le=1)
    top: bool = True
    must_not: list[MustNot] = Field(default_factory=list)
    # held-out hygiene: a case read before a change (its diagnosis looked at, a miss explained, a rule's test
    # written from its numbers) or recorded for one is seen; its yield is reported apart from the unseen
    seen: bool | None = None            # required of a held-out case (`eroica eval` says so); None: not said
    seen_why: str | None = None

    @model_validator(mode="after")
    def _seen_says_why(self) -> Expected:
        if self.seen and not (self.seen_why or "").strip():
            raise ValueError("seen: true needs seen_why: when the case was read or what it was recorded for")
        return self


@dataclass
class IncidentResult:
    id: str
    causes: list[str]                 # expected root causes ([] = healthy)
    correct: bool
    false_findings: int               # findings at >= min_confidence matching no expectation
    reasons: list[str] = field(default_factory=list)
    onset_to_window_steps: int | None = None
    window_steps: int | None = None
    heterogeneous: bool = False       # ranks do different work by design (a healthy run all the same)
    seen: bool = False                # read before a change or recorded for it (expected.yaml `seen`)
    # every finding of the judged window: (confidence, whether it matches an expectation), for calibration
    scored: list[tuple[float, bool]] = field(default_factory=list)
    # and for fitting the rule priors: (the rule whose prior it is, the product of its other factors, right)
    prior_samples: list[tuple[str, float, bool]] = field(default_factory=list)
    present_not_costly: bool = False  # missed, but the expected cause is present, its confidence lowered by cost

    @property
    def healthy(self) -> bool:
        return not self.causes


def _matches(f: Finding, e: Expectation) -> bool:
    return (f.root_cause == e.root_cause and sorted(f.ranks) == sorted(e.ranks)
            and (e.function_contains is None or e.function_contains in (f.function or "")))


def _forbidden(f: Finding, m: MustNot) -> bool:
    if m.ranks_other_than is not None and not set(f.ranks) - set(m.ranks_other_than):
        return False
    return m.root_cause is None or f.root_cause == m.root_cause


def load_expected(path: Path) -> Expected:
    try:
        return Expected.model_validate(yaml.load(path.read_text(), Loader=SAFE_LOADER) or {})
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors())
        raise RunDirError(f"invalid expected.yaml: {why}", path=str(path)) from exc
    except Exception as exc:
        raise RunDirError(f"invalid expected.yaml: {exc}", path=str(path)) from exc


def naming_rules(rules: list[Any]) -> dict[str, list[tuple[str, str]]]:
    """incident id -> [(rule id, its root cause)] for every rule that names the incident."""
    out: dict[str, list[tuple[str, str]]] = {}
    for lr in rules:
        for inc in lr.rule.incidents:
            out.setdefault(inc, []).append((lr.rule.id, lr.rule.taxonomy))
    return out


def evaluate_incident(inc: Path, opts: DiagnoseOptions | None = None,
                      named_by: list[tuple[str, str]] | None = None) -> IncidentResult:
    """`named_by`: the rules that name this incident (each must be among the rules that fired).
    Diagnose the incident's windows (all at once: earlier windows are the job's history) and
    judge the first window that opened at or after the fault's onset; windows before it are the
    job's healthy past, and a confident finding there is a false finding."""
    exp = load_expected(inc / "expected.yaml")
    causes = [e.root_cause for e in exp.expect]
    ctx = _context(inc)
    res = IncidentResult(inc.name, causes, correct=False, false_findings=0,
                         heterogeneous=bool((ctx.get("job") or {}).get("heterogeneous")), seen=bool(exp.seen))
    pdir = inc / "patterns"
    if causes and pdir.is_dir() and not any(pdir.iterdir()):
        res.reasons.append("no window opened after the fault began: a missed slowdown")
        return res
    try:
        d = diagnose(pdir, opts)
    except EngineError as exc:
        res.reasons.append(f"diagnosis failed: {exc}")
        return res
    if not d.windows:
        res.reasons.append("no window to judge")
        return res
    onset = (ctx.get("injected") or {}).get("from_step")
    onset = int(onset) if onset is not None and causes else None
    after = [w for w in d.windows if onset is None or w.start_step >= onset]
    if onset is not None and not after:
        res.reasons.append(f"no window opened at or after the fault's onset (step {onset}): a missed slowdown")
        return res
    w = after[0] if onset is not None else d.windows[-1]
    history = [h for h in d.windows if h.start_step < w.start_step]
    res.window_steps = w.end_step - w.start_step
    if onset is not None:
        res.onset_to_window_steps = w.start_step - onset
    for h in history:      # the job before the fault: healthy
        fs = [f for f in h.findings if f.confidence >= exp.min_confidence]
        if onset is not None and h.end_step > onset:    # it saw the fault's first steps: the fault is no false finding
            fs = [f for f in fs if not any(_matches(f, e) for e in exp.expect)]
        if fs:
            res.false_findings += len(fs)
            res.reasons.append(f"window {h.window} before the fault has {len(fs)} finding(s) at >= "
                               f"{exp.min_confidence}: {[(f.root_cause, f.ranks) for f in fs]}")
    confident = [f for f in w.findings if f.confidence >= exp.min_confidence]
    ok = not res.false_findings
    for i, e in enumerate(exp.expect):
        lo = exp.min_confidence if e.min_confidence is None else e.min_confidence
        hi = 1.0 if e.max_confidence is None else e.max_confidence
        hit = any(_matches(f, e) and lo <= f.confidence <= hi for f in w.findings)
        if not hit:
            ok = False
            got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in w.findings[:3]]
            res.reasons.append(f"missing {e.root_cause} on ranks {e.ranks} at confidence {lo}-{hi}; got {got}")
        elif i == 0 and exp.top and not _matches(w.findings[0], e):
            ok = False
            res.reasons.append(f"{e.root_cause} found but not the top finding ({w.findings[0].root_cause})")
    for rule_id, cause in named_by or []:     # a rule that names this incident must be the one that fired
        hits = [f for f in w.findings if f.root_cause == cause and any(_matches(f, e) for e in exp.expect)]
        if hits and not any(rule_id in f.rule_ids for f in hits):
            ok = False
            res.reasons.append(f"rule {rule_id} names this incident, but {cause} came from "
                               f"{', '.join(sorted({r for f in hits for r in f.rule_ids}))}")
    unexplained = [f for f in confident if not any(_matches(f, e) for e in exp.expect)]
    res.false_findings += len(unexplained)
    res.scored = [(f.confidence, any(_matches(f, e) for e in exp.expect)) for f in w.findings]
    res.prior_samples = [(f.confidence_factors.prior_rule_id, f.confidence / f.confidence_factors.rule_ratio, ok_)
                         for f, (_, ok_) in zip(w.findings, res.scored)
                         if f.confidence_factors.prior_rule_id and f.confidence_factors.rule_ratio > 0]
    for f in confident:
        for m in exp.must_not:
            if _forbidden(f, m) and not any(_matches(f, e) for e in exp.expect):
                ok = False
                res.reasons.append(f"forbidden finding {f.root_cause} on ranks {f.ranks} ({f.confidence:.2f})")
    if not causes and unexplained:
        ok = False
        res.reasons.append(f"{'heterogeneous' if res.heterogeneous else 'healthy'} run has {len(unexplained)} "
                           f"finding(s) at >= {exp.min_confidence}: {[(f.root_cause, f.ranks) for f in unexplained]}")
    res.correct = ok
    # a miss whose every expected cause is on its ranks and present at the threshold, below it only for
    # what it costs (eroica.schema.diagnosis.ConfidenceFactors.presence): said apart, never counted as right
    res.present_not_costly = not ok and bool(exp.expect) and not res.false_findings and all(
        any(_matches(f, e) and (f.presence_confidence or 0.0) >= exp.min_confidence for f in w.findings)
        for e in exp.expect)
    return res


def _context(inc: Path) -> dict[str, Any]:
    p = inc / "context.yaml"
    try:
        data = yaml.load(p.read_text(), Loader=SAFE_LOADER) if p.exists() else {}
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


HELDOUT = "heldout"     # incidents of a job the rules were not written on: measured, never tuned on


def find_incidents(root: Path) -> list[Path]:
    """The incidents directly under `root` (or `root` itself); `root/heldout/` is not among them."""
    root = Path(root)
    if (root / "expected.yaml").exists():
        return [root]
    if not root.is_dir():
        raise RunDirError("not an incident directory or a folder of incidents", path=str(root))
    return sorted(p for p in root.iterdir() if (p / "expected.yaml").exists())


def find_heldout(root: Path) -> list[Path]:
    """The held-out incidents beside a library (`root/heldout/`), none when there is no such folder."""
    held = Path(root) / HELDOUT
    return find_incidents(held) if held.is_dir() and not (Path(root) / "expected.yaml").exists() else []


CALIBRATION_BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0001)


def calibration(results: list[IncidentResult]) -> tuple[list[tuple[str, int, float, float]], float | None]:
    """Reliability of the stated confidence over every finding of the judged windows: per bin
    (range, findings, mean confidence, share that matched an expectation), and the Brier score
    (mean squared gap between confidence and being right; 0 is perfect). A missed root cause is no
    finding and does not enter it: the yield counts those."""
    pairs = [p for r in results for p in r.scored]
    rows = []
    for lo, hi in zip(CALIBRATION_BINS, CALIBRATION_BINS[1:]):
        b = [(c, ok) for c, ok in pairs if lo <= c < hi]
        if b:
            rows.append((f"{lo:.1f}-{min(hi, 1.0):.1f}", len(b), sum(c for c, _ in b) / len(b),
                         sum(ok for _, ok in b) / len(b)))
    brier = sum((c - float(ok)) ** 2 for c, ok in pairs) / len(pairs) if pairs else None
    return rows, brier


def library_fits(results: list[IncidentResult]) -> tuple[list[PriorFit], int]:
    """Each rule's prior fitted on the library's results (replayed with the hand-set priors), and the
    number of findings it was fitted on."""
    samples = [PriorSample(rid, x, ok) for r in results for rid, x, ok in r.prior_samples]
    return fit_priors(samples, {lr.rule.id: lr.rule.emit.confidence for lr in load_rules()}), len(samples)


PROMOTE_MIN_INCIDENTS = 3    # recorded incidents a rule must diagnose before it is stable


@dataclass
class PromotionCandidate:
    rule_id: str
    path: str
    incidents: list[str]
    false_findings: int           # confident findings of its root cause on healthy or heterogeneous runs


def promotion_candidates(root: Path | list[Path], rules: list[Any], min_incidents: int = PROMOTE_MIN_INCIDENTS,
                         opts: DiagnoseOptions | None = None) -> list[PromotionCandidate]:
    """Experimental rules ready for `stable`: at least `min_incidents` incidents name the rule, each
    is diagnosed right with the rule among those that fired, and no healthy or heterogeneous run of
    the libraries (or their held-out sets) has a confident finding of its root cause. With no healthy
    run at all, nothing shows that a rule stays quiet: none is ready."""
    roots = root if isinstance(root, list) else [root]
    incs: dict[str, Path] = {}
    for r in roots:                      # an incident in two libraries: the first library's copy
        for p in find_incidents(r) + find_heldout(r):
            incs.setdefault(p.name, p)
    named = naming_rules(rules)
    quiet_runs = [p for p in incs.values() if not load_expected(p / "expected.yaml").expect]
    if not quiet_runs:
        return []
    fired_on_quiet: dict[str, int] = {}
    for p in quiet_runs:
        for w in diagnose(p / "patterns", opts).windows:
            for f in w.findings:
                if f.confidence >= 0.5:
                    fired_on_quiet[f.root_cause] = fired_on_quiet.get(f.root_cause, 0) + 1
    out = []
    for lr in rules:
        r = lr.rule
        if r.status.value != "experimental" or len(r.incidents) < min_incidents:
            continue
        ok = all(i in incs and evaluate_incident(incs[i], opts, named.get(i)).correct for i in r.incidents)
        false = fired_on_quiet.get(r.taxonomy, 0)
        if ok and not false:
            out.append(PromotionCandidate(r.id, str(lr.path), list(r.incidents), false))
    return out
