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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from eroica.engine.diagnose import DiagnoseOptions, diagnose
from eroica.engine.diagnosis import Finding
from eroica.engine.errors import EngineError, RunDirError


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


@dataclass
class IncidentResult:
    id: str
    causes: list[str]                 # expected root causes ([] = healthy)
    correct: bool
    false_findings: int               # findings at >= min_confidence matching no expectation
    reasons: list[str] = field(default_factory=list)
    onset_to_window_steps: int | None = None
    window_steps: int | None = None

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
        return Expected.model_validate(yaml.safe_load(path.read_text()) or {})
    except Exception as exc:
        raise RunDirError(f"invalid expected.yaml: {exc}", path=str(path)) from exc


def evaluate_incident(inc: Path, opts: DiagnoseOptions | None = None) -> IncidentResult:
    exp = load_expected(inc / "expected.yaml")
    causes = [e.root_cause for e in exp.expect]
    res = IncidentResult(inc.name, causes, correct=False, false_findings=0)
    try:
        d = diagnose(inc / "patterns", opts)
    except EngineError as exc:
        res.reasons.append(f"diagnosis failed: {exc}")
        return res
    if len(d.windows) != 1:
        res.reasons.append(f"expected one window, found {len(d.windows)}")
        return res
    w = d.windows[0]
    res.window_steps = w.end_step - w.start_step
    ctx = _context(inc)
    onset = ctx.get("injected", {}).get("from_step")
    if onset is not None and causes:
        res.onset_to_window_steps = w.start_step - int(onset)
    confident = [f for f in w.findings if f.confidence >= exp.min_confidence]
    ok = True
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
    unexplained = [f for f in confident if not any(_matches(f, e) for e in exp.expect)]
    res.false_findings = len(unexplained)
    for f in confident:
        for m in exp.must_not:
            if _forbidden(f, m) and not any(_matches(f, e) for e in exp.expect):
                ok = False
                res.reasons.append(f"forbidden finding {f.root_cause} on ranks {f.ranks} ({f.confidence:.2f})")
    if not causes and unexplained:
        ok = False
        res.reasons.append(f"healthy run has {len(unexplained)} finding(s) at >= {exp.min_confidence}")
    res.correct = ok
    return res


def _context(inc: Path) -> dict[str, Any]:
    p = inc / "context.yaml"
    try:
        data = yaml.safe_load(p.read_text()) if p.exists() else {}
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def find_incidents(root: Path) -> list[Path]:
    root = Path(root)
    if (root / "expected.yaml").exists():
        return [root]
    if not root.is_dir():
        raise RunDirError("not an incident directory or a folder of incidents", path=str(root))
    return sorted(p for p in root.iterdir() if (p / "expected.yaml").exists())
