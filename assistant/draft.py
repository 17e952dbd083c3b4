"""`eroica draft`: a change request per finding, behind change control. Nothing is ever applied.

Software findings get a drafted fix (a unified diff or a config change) that passed the gate, or a
change request that says a human must write the fix and why; hardware findings get a hand-off
ticket for people. Every request carries the evidence, risk, a validation plan built from the
window's own numbers, a rollback plan and an empty approver field.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import jinja2
import yaml

from eroica.assistant.backends import Context, ModelSettings, llm, offline
from eroica.assistant.errors import BackendConfigError, DraftInputError
from eroica.assistant.gate import check
from eroica.assistant.models import DraftOutcome, Proposal, Remediation, load_remediations
from eroica.assistant.redact import Redactor
from eroica.engine.diagnosis import Diagnosis, Finding, WindowDiagnosis
from eroica.engine.rules.loader import builtin_knowledge_dir

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


def draft_all(diagnosis: Diagnosis, out_dir: Path, repo: Path | None = None, backend: str = "offline",
              settings: ModelSettings | None = None, redact_patterns: list[str] | None = None,
              min_confidence: float = MIN_CONFIDENCE) -> list[DraftOutcome]:
    remediations = load_remediations(builtin_knowledge_dir() / "remediations")
    by_template = {r.id: r for r in remediations.values()}
    by_cause = {c: r for r in remediations.values() for c in r.root_causes}
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[DraftOutcome] = []
    n = 0
    for w in diagnosis.windows:
        for f in w.findings:
            if f.confidence < min_confidence and f.root_cause != "unknown":
                continue
            n += 1
            d = out_dir / f"{n:02d}-{w.window}-{_slug(f)}"
            d.mkdir(parents=True, exist_ok=True)
            if f.category.value == "hardware":
                (d / "ticket.md").write_text(_env().get_template("hardware_ticket.md.j2").render(f=f, w=w, d=diagnosis))
                outcomes.append(DraftOutcome(finding=f"{f.root_cause} on rank {f.ranks}", kind="ticket",
                                             directory=str(d), backend="none"))
                continue
            rem = by_template.get(f.fix_template or "") or by_cause.get(f.root_cause)
            outcomes.append(_software(diagnosis, w, f, rem, d, repo, backend, settings, redact_patterns or []))
    (out_dir / "drafts.json").write_text(json.dumps([o.model_dump() for o in outcomes], indent=2) + "\n")
    return outcomes


def _software(diagnosis: Diagnosis, w: WindowDiagnosis, f: Finding, rem: Remediation | None, d: Path,
              repo: Path | None, backend: str, settings: ModelSettings | None, patterns: list[str]) -> DraftOutcome:
    ctx = Context(finding=f, remediation=rem, repo=repo)
    redactor = Redactor(hostnames=[h for fi in w.findings for h in fi.hosts], extra=patterns)
    if backend == "openai":
        if settings is None:
            raise BackendConfigError("the openai backend needs model settings")
        proposal = llm(ctx, settings, redactor)
    else:
        proposal = offline(ctx)
    refusal = check(proposal, repo, ctx.allowed_files, {s.key for s in f.settings})   # keys that exist here
    if refusal is None and proposal.kind == "diff":
        (d / "patch.diff").write_text(proposal.diff if proposal.diff.endswith("\n") else proposal.diff + "\n")
    if refusal is None and proposal.kind == "config":
        (d / "config_change.yaml").write_text(yaml.safe_dump(
            {"changes": [c.model_dump() for c in proposal.config]}, sort_keys=False))
    if ctx.sent:
        (d / "sent_to_model.txt").write_text(ctx.sent + "\n")
    kind = "human" if refusal else ("code" if proposal.kind == "diff" else "config")
    text = _env().get_template("change_request.md.j2").render(
        f=f, w=w, d=diagnosis, rem=rem, proposal=proposal if refusal is None else Proposal(kind="none"),
        refusal=refusal, backend=backend, sent=bool(ctx.sent), replaced=redactor.replaced,
        settings=settings)
    (d / "change_request.md").write_text(text)
    return DraftOutcome(finding=f"{f.root_cause} on rank {f.ranks}", kind=kind, directory=str(d), backend=backend,
                        refusal=refusal, sent_to_model=bool(ctx.sent))
