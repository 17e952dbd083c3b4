"""`eroica draft`: a change request per finding, behind change control. Nothing is ever applied.

Software findings get a drafted fix (a unified diff or a config change) that passed the gate, or a
change request that says a human must write the fix and why; hardware findings get a hand-off
ticket for people. Every request carries the evidence, risk, a validation plan built from the
window's own numbers, a rollback plan and an empty approver field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import yaml

from eroica.assistant.backends import MODEL_CAUSES, Context, ModelSettings, llm, offline
from eroica.assistant.errors import BackendConfigError, DraftInputError
from eroica.assistant.gate import VALIDATE_TIMEOUT_SECONDS, check, validation_command
from eroica.assistant.models import DraftOutcome, Proposal, Remediation, load_remediations
from eroica.assistant.redact import Redactor
from eroica.engine.rules import builtin_knowledge_dir, load_rules
from eroica.schema.diagnosis import Diagnosis, Finding, WindowDiagnosis

MIN_CONFIDENCE = 0.5


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda n: (resources.files("eroica.assistant") / "templates" / n).read_text()),
        autoescape=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def load_diagnosis(path: Path) -> Diagnosis:
    try:
        return Diagnosis.model_validate(json.loads(Path(path).read_text()))
    except FileNotFoundError as exc:
        raise DraftInputError(f"{path}: no such file (write one with: eroica diagnose RUN_DIR --format json -o FILE)") \
            from exc
    except (json.JSONDecodeError, ValueError) as exc:
        raise DraftInputError(f"{path}: not an eroica.diagnosis/v1 document: {str(exc)[:300]}") from exc


def _slug(f: Finding) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", f"{f.root_cause}-rank{'-'.join(map(str, f.ranks))}".lower())


def _owners() -> dict[str, str]:
    try:
        return {lr.rule.id: lr.rule.owner for lr in load_rules()}
    except Exception:   # a broken site rule set: the approver is then left for people to fill
        return {}


@dataclass
class Options:
    repo: Path | None = None
    backend: str = "offline"
    settings: ModelSettings | None = None
    redact_patterns: list[str] = field(default_factory=list)
    min_confidence: float = MIN_CONFIDENCE
    validate: str | None = None                     # the repository's validation command (the gate runs it)
    validate_timeout_seconds: float = VALIDATE_TIMEOUT_SECONDS
    sandboxed_validation: bool = True               # False only when asked in so many words (no bwrap here)


def _grouped(diagnosis: Diagnosis, min_confidence: float) -> list[tuple[Finding, WindowDiagnosis, list[str]]]:
    """One entry per root cause and ranks across the run's windows: its most confident finding, the
    window it came from, and every window that found it."""
    groups: dict[tuple[str, tuple[int, ...]], tuple[Finding, WindowDiagnosis, list[str]]] = {}
    for w in diagnosis.windows:
        for f in w.findings:
            if f.confidence < min_confidence and f.root_cause != "unknown":
                continue
            key = (f.root_cause, tuple(f.ranks))
            if key not in groups:
                groups[key] = (f, w, [w.window])
                continue
            best, bw, seen = groups[key]
            seen.append(w.window)
            if f.confidence > best.confidence:
                groups[key] = (f, w, seen)
    return list(groups.values())


def draft_all(diagnosis: Diagnosis, out_dir: Path, repo: Path | None = None, backend: str = "offline",
              settings: ModelSettings | None = None, redact_patterns: list[str] | None = None,
              min_confidence: float = MIN_CONFIDENCE, options: Options | None = None) -> list[DraftOutcome]:
    o = options or Options(repo=repo, backend=backend, settings=settings, redact_patterns=redact_patterns or [],
                           min_confidence=min_confidence)
    remediations = load_remediations(builtin_knowledge_dir() / "remediations")
    by_template = {r.id: r for r in remediations.values()}
    by_cause = {c: r for r in remediations.values() for c in r.root_causes}
    owners = _owners()
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[DraftOutcome] = []
    for n, (f, w, windows) in enumerate(_grouped(diagnosis, o.min_confidence), start=1):
        d = out_dir / f"{n:02d}-{_slug(f)}"
        d.mkdir(parents=True, exist_ok=True)
        approver = next((owners[r] for r in f.rule_ids if r in owners), "")
        rem = by_template.get(f.fix_template or "") or by_cause.get(f.root_cause)
        common = dict(root_cause=f.root_cause, ranks=list(f.ranks), windows=windows)
        if f.category.value == "hardware":
            (d / "ticket.md").write_text(_env().get_template("hardware_ticket.md.j2").render(
                f=f, w=w, d=diagnosis, windows=windows, approver=approver, rem=rem))
            outcomes.append(DraftOutcome(finding=f"{f.root_cause} on rank {f.ranks}", kind="ticket",
                                         directory=str(d), backend="none", **common))
            # the model also drafts beside the ticket for a cause no template fixes (a transient stall)
            model = o.backend == "openai" and f.root_cause in MODEL_CAUSES
            if o.repo is None or ((rem is None or rem.action == "guidance") and not model):
                continue
            d = d / "code"                               # a code change beside the ticket (async checkpoint)
            d.mkdir(exist_ok=True)
        outcomes.append(_software(diagnosis, w, f, rem, d, o, approver, common))
    write_outcomes(out_dir, outcomes)
    return outcomes


def write_outcomes(out_dir: Path, outcomes: list[DraftOutcome]) -> None:
    """`drafts.json`: every outcome, as `eroica draft` printed them."""
    (out_dir / "drafts.json").write_text(json.dumps([x.model_dump() for x in outcomes], indent=2) + "\n")


def _software(diagnosis: Diagnosis, w: WindowDiagnosis, f: Finding, rem: Remediation | None, d: Path,
              o: Options, approver: str, common: dict[str, Any]) -> DraftOutcome:
    ctx = Context(finding=f, remediation=rem, repo=o.repo)
    redactor = Redactor.for_site(hostnames=[h for fi in w.findings for h in fi.hosts], extra=o.redact_patterns)
    if o.backend == "openai":
        if o.settings is None:
            raise BackendConfigError("the openai backend needs model settings")
        proposal = llm(ctx, o.settings, redactor)
    else:
        proposal = offline(ctx)
    gate = check(proposal, o.repo, ctx.scope(), o.validate, o.validate_timeout_seconds, o.sandboxed_validation)
    refusal = gate.refusal
    if refusal is None and proposal.kind == "diff":
        (d / "patch.diff").write_text(proposal.diff if proposal.diff.endswith("\n") else proposal.diff + "\n")
    if refusal is None and proposal.kind == "config":
        (d / "config_change.yaml").write_text(yaml.safe_dump(
            {"changes": [c.model_dump() for c in proposal.config]}, sort_keys=False))
    if refusal is not None:
        (d / "rejected.txt").write_text(f"{refusal}\n\nproposal ({proposal.kind}): {proposal.rationale}\n"
                                        + (proposal.diff or "") + (f"\nvalidation output:\n{gate.validation_output}"
                                                                   if gate.validation_output else ""))
    if ctx.sent:
        (d / "sent_to_model.txt").write_text(ctx.sent + "\n")
    kind = "human" if refusal else ("code" if proposal.kind == "diff" else "config")
    t = ctx.target.found if ctx.target is not None else None
    text = _env().get_template("change_request.md.j2").render(
        f=f, w=w, d=diagnosis, rem=rem, proposal=proposal if refusal is None else Proposal(kind="none"),
        refusal=refusal, backend=o.backend, sent=bool(ctx.sent), replaced=redactor.replaced,
        settings=o.settings, gate=gate, approver=approver, windows=common["windows"], target=ctx.target,
        validate=validation_command(o.repo, o.validate) if o.repo is not None else None)
    (d / "change_request.md").write_text(text)
    return DraftOutcome(finding=f"{f.root_cause} on rank {f.ranks}", kind=kind, directory=str(d), backend=o.backend,
                        refusal=refusal, sent_to_model=bool(ctx.sent), target=str(t) if t else None,
                        checks=gate.checks, **common)
