"""`eroica eval --drafts`: the draft yield. Every software finding of the recorded incidents (those
whose fix is code) is drafted offline against every training repository under `incidents/repos/`,
as if the job had run from that repository: the finding's recorded sites are the ones the
collector records there (`eroica-eval.yaml: sites`). A draft counts when it targets the lines the
repository says the fix belongs on (`expect`), applies, compiles and passes the repository's own
validation command, all through the same gate `eroica draft` uses. Where the repository has no
target for a cause, the right answer is no draft; a draft there, or one that changes other lines,
is counted as a wrong draft."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eroica.assistant.backends import CODE_ACTIONS, Context, action_of, offline
from eroica.assistant.gate import GateReport, Scope, check_diff, misplaced, removed_lines, touched_files
from eroica.assistant.models import Remediation, load_remediations
from eroica.engine import DiagnoseOptions, diagnose, find_incidents
from eroica.engine.rules import builtin_knowledge_dir
from eroica.schema.diagnosis import Finding

EVAL_FILE = "eroica-eval.yaml"
FAKE_ROOT = "/home/ci/checkouts"
WHERE = re.compile(r"^\S+:\d+ `[^`]*`: ")     # the sites as a collector on another machine records them (absolute)


@dataclass(frozen=True)
class Span:
    file: str
    line: int
    end_line: int


@dataclass
class Repo:
    path: Path
    sites: dict[str, str]
    expect: dict[str, Span]

    @property
    def name(self) -> str:
        return self.path.name

    def expected(self, f: Finding) -> Span | None:
        return self.expect.get(f"{f.root_cause}.{f.function}") or self.expect.get(f.root_cause)


@dataclass
class Case:
    incident: str
    repo: str
    cause: str
    function: str | None
    verdict: str             # drafted, missed, none (correct), wrong
    detail: str


@dataclass
class DraftEval:
    cases: list[Case] = field(default_factory=list)
    diffs: set[tuple[str, str]] = field(default_factory=set)     # (repository, diff) of every draft made

    def distinct(self) -> tuple[int, int, int]:
        """Drafted and due (cause, function, repository) kinds: the same finding of several incidents
        drafts the same change, counted once (right only when every one of them was); and how many
        distinct diffs were drafted at all."""
        kinds: dict[tuple[str, str | None, str], bool] = {}
        for c in self.cases:
            if c.verdict in ("drafted", "missed", "wrong"):
                key = (c.cause, c.function, c.repo)
                kinds[key] = kinds.get(key, True) and c.verdict == "drafted"
        return sum(kinds.values()), len(kinds), len(self.diffs)

    def reasons(self, verdict: str) -> Counter[str]:
        """Why, by cause, for the cases of one verdict (the reason without the file and code it names)."""
        def why(detail: str) -> str:
            detail = WHERE.sub("", detail)             # "train.py:8 `return DataLoader(`: ..." names a place
            return ": ".join(detail.split(": ")[:2]).removesuffix(" (tests excluded)")[:110] or "?"
        return Counter(f"{c.cause}: {why(c.detail)}" for c in self.cases if c.verdict == verdict)

    def counts(self) -> tuple[int, int, int, int]:
        should = [c for c in self.cases if c.verdict in ("drafted", "missed")]
        wrong = [c for c in self.cases if c.verdict == "wrong"]
        none = [c for c in self.cases if c.verdict == "none"]
        return sum(c.verdict == "drafted" for c in should), len(should), len(wrong), len(none)


def _line(path: Path, text: str, after: int = 0) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if i > after and text in line:
            return i
    raise ValueError(f"{path}: no line contains {text!r} (fix {EVAL_FILE})")


def load_repo(path: Path) -> Repo:
    raw = yaml.safe_load((path / EVAL_FILE).read_text()) or {}
    sites = {}
    for key, s in (raw.get("sites") or {}).items():       # one frame, or a list (innermost first)
        sites[key] = " < ".join(f"{FAKE_ROOT}/{path.name}/{x['file']}:{_line(path / x['file'], x['at'])}"
                                for x in (s if isinstance(s, list) else [s]))
    expect = {}
    for key, s in (raw.get("expect") or {}).items():
        start = _line(path / s["file"], s["at"])
        end = _line(path / s["file"], s["to"], start - 1) if s.get("to") else start
        expect[key] = Span(s["file"], start, end)
    return Repo(path, sites, expect)


def find_repos(root: Path) -> list[Repo]:
    return [load_repo(p) for p in sorted(Path(root).iterdir()) if (p / EVAL_FILE).is_file()]


def code_findings(incidents: Path) -> list[tuple[str, Finding, Remediation]]:
    """(incident, finding, remediation) for every confident finding whose fix is code, one per cause
    and function in each incident."""
    rems = load_remediations(builtin_knowledge_dir() / "remediations")
    by_template = {r.id: r for r in rems.values()}
    by_cause = {c: r for r in rems.values() for c in r.root_causes}
    out, opts = [], DiagnoseOptions(in_process=True)
    for inc in find_incidents(incidents):
        seen = set()
        for w in diagnose(inc / "patterns", opts).windows:
            for f in w.findings:
                rem = by_template.get(f.fix_template or "") or by_cause.get(f.root_cause)
                key = (f.root_cause, f.function)
                if f.confidence < 0.5 or key in seen or action_of(f, rem) not in CODE_ACTIONS:
                    continue
                seen.add(key)
                assert rem is not None
                out.append((inc.name, f, rem))
    return out


def _inside(diff: str, span: Span, repo: Path) -> str | None:
    """Why the draft is not where the repository says the fix belongs: a deleted or rewritten line
    outside the expected lines, or an added one (other than an import or helper in the header)."""
    files = touched_files(diff)
    if files != [span.file]:
        return f"touches {', '.join(files)} (expected {span.file})"
    bad = [(n, t) for _f, n, t in removed_lines(diff) if not span.line <= n <= span.end_line]
    if bad:
        return f"changes line {bad[0][0]} outside {span.file}:{span.line}-{span.end_line}"
    return misplaced(diff, repo, Scope(lines={span.file: [(span.line, span.end_line)]}))


def draft_yield(incidents: Path, repos_root: Path, validate: bool = True,
             progress: Callable[[str], None] | None = None) -> DraftEval:
    repos, findings = find_repos(repos_root), code_findings(incidents)
    drafts: list[tuple[str, Repo, Finding, Span | None, str, str]] = []   # (incident, repo, f, span, diff, why)
    scopes: dict[tuple[str, str], Scope] = {}
    for inc, f, rem in findings:
        for repo in repos:
            moved = f.model_copy(update={"sites": repo.sites})
            ctx = Context(finding=moved, remediation=rem, repo=repo.path)
            p = offline(ctx)
            diff = p.diff if p.kind == "diff" else ""
            drafts.append((inc, repo, f, repo.expected(f), diff, p.rationale))
            scopes.setdefault((repo.name, diff), ctx.scope())      # what the evidence located, as in `eroica draft`
    unique = {(d[1].name, d[4]): d[1] for d in drafts if d[4]}
    gates: dict[tuple[str, str], GateReport] = {}

    def gate(key: tuple[str, str]) -> None:
        repo = unique[key]
        gates[key] = check_diff(key[1], repo.path, scopes[key], None if validate else "true")
        if progress is not None:
            progress(f"gate {len(gates)}/{len(unique)}: {repo.name} {hashlib.sha1(key[1].encode()).hexdigest()[:8]}")
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(gate, unique))
    out = DraftEval(diffs=set(unique))
    for inc, repo, f, span, diff, why in drafts:
        g: GateReport | None = gates.get((repo.name, diff)) if diff else None
        if span is None:
            verdict, detail = ("wrong", f"drafted where the repository has no target: {touched_files(diff)}") \
                if diff else ("none", why)
        elif not diff:
            verdict, detail = "missed", why
        elif (off := _inside(diff, span, repo.path)) is not None:
            verdict, detail = "wrong", off
        elif g is not None and g.refusal:
            verdict, detail = "missed", f"the gate refused it: {g.refusal}"
        else:
            verdict, detail = "drafted", "; ".join(g.checks[-1:]) if g else ""
        out.cases.append(Case(inc, repo.name, f.root_cause, f.function, verdict, detail))
    return out


SYMBOL = {"drafted": "ok", "missed": "MISSED", "wrong": "WRONG", "none": "-"}


def table(ev: DraftEval) -> str:
    causes = sorted({c.cause for c in ev.cases})
    repos = sorted({c.repo for c in ev.cases})
    rows = [["repository", *causes]]
    for r in repos:
        row = [r]
        for cause in causes:
            cs = [c for c in ev.cases if c.repo == r and c.cause == cause]
            verdicts = sorted({c.verdict for c in cs})
            if verdicts == ["none"]:
                row.append("-")
            else:
                ok = sum(c.verdict == "drafted" for c in cs)
                row.append(f"{ok}/{sum(c.verdict != 'none' for c in cs)}" +
                           ("" if set(verdicts) <= {"drafted", "none"} else " " + "+".join(
                               SYMBOL[v] for v in verdicts if v not in ("drafted", "none"))))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    drafted, should, wrong, none = ev.counts()
    kinds_ok, kinds, diffs = ev.distinct()
    lines += ["", "cells: drafts that target the right lines, apply, compile and pass the repository's validation / "
              "findings whose target exists there; '-': no target there, nothing drafted (correct)",
              f"draft yield: {kinds_ok}/{kinds} distinct (cause, function, repository); {drafted}/{should} counting "
              f"each incident's finding; {diffs} distinct diffs drafted",
              f"drafts touching anything else: {wrong}",
              f"no target, nothing drafted: {none}"]
    for verdict, label in (("none", "nothing drafted, because"), ("missed", "missed, because"),
                           ("wrong", "wrong, because")):
        lines += [f"  {label}: {why} ({n})" for why, n in ev.reasons(verdict).most_common()]
    for c in ev.cases:
        if c.verdict in ("missed", "wrong"):
            lines.append(f"  {c.verdict}: {c.incident} {c.cause} ({c.function}) on {c.repo}: {c.detail[:200]}")
    return "\n".join(lines)
