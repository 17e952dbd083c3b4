"""Two ways to draft: `offline` (deterministic, from the remediation templates) and `openai` (any
OpenAI-compatible endpoint through the official client). Both return a Proposal; neither applies
anything. The model backend never raises: every failure becomes a Proposal of kind "none" whose
rationale says why (the draft is then refused and a human writes the fix)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eroica.assistant.code import dataloader_edit, gc_freeze_edit, relevant_code, unified_diff
from eroica.assistant.errors import BackendConfigError
from eroica.assistant.models import ConfigEdit, Proposal, Remediation
from eroica.assistant.redact import Redactor
from eroica.engine.diagnosis import Finding


@dataclass
class Context:
    """What a backend may use: the finding, its remediation template and the repository."""

    finding: Finding
    remediation: Remediation | None
    repo: Path | None
    allowed_files: set[str] = field(default_factory=set)     # files the draft may touch (filled by backends)
    sent: str = ""                                           # what was sent to a model, verbatim


def offline(ctx: Context) -> Proposal:
    rem, f = ctx.remediation, ctx.finding
    if rem is None:
        return Proposal(kind="none", rationale=f"no remediation template for {f.root_cause}")
    if rem.action == "align_settings":
        if not f.settings:
            return Proposal(kind="none", rationale="the finding names no setting that differs from the peers")
        return Proposal(kind="config", rationale=rem.title, config=[
            ConfigEdit(key=s.key, before=s.value, after=s.peer_value, where=f"rank {', '.join(map(str, f.ranks))}")
            for s in f.settings])
    if rem.action in ("dataloader_kwargs", "gc_freeze"):
        if ctx.repo is None:
            return Proposal(kind="none", rationale="no repository given (--repo): the code cannot be drafted")
        if rem.action == "dataloader_kwargs":
            edits = dataloader_edit(ctx.repo, int(rem.params.get("num_workers", 4)),
                                    int(rem.params.get("prefetch_factor", 4)))
        else:
            edits = gc_freeze_edit(ctx.repo)
        if not edits:
            what = "DataLoader(...) call" if rem.action == "dataloader_kwargs" else "training loop calling .step()"
            return Proposal(kind="none", rationale=f"no {what} found in the repository")
        ctx.allowed_files |= {e.path.relative_to(ctx.repo).as_posix() for e in edits}
        return Proposal(kind="diff", rationale=rem.title,
                        diff="".join(unified_diff(ctx.repo, e.path, e.before, e.after) for e in edits))
    return Proposal(kind="none", rationale=f"{rem.title}: this needs a person's judgement ({rem.guidance})")


SYSTEM = (
    "You draft fixes for slow distributed training jobs. Reply with one JSON object only: "
    '{"kind": "diff" | "config" | "none", "diff": "<unified diff with a/ and b/ paths, or empty>", '
    '"config": [{"key": "...", "before": "...", "after": "..."}], "rationale": "<one sentence>"}. '
    "Change only the code shown; never add network calls, subprocesses or secrets."
)


@dataclass
class ModelSettings:
    base_url: str
    model: str
    api_key: str
    timeout_seconds: float = 60.0

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None) -> ModelSettings:
        url = base_url or os.environ.get("EROICA_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not url:
            raise BackendConfigError("the openai backend needs an endpoint: --base-url or EROICA_LLM_BASE_URL "
                             "(any OpenAI-compatible server: vLLM, llama.cpp server, Ollama, a hosted API)")
        return cls(base_url=url, model=model or os.environ.get("EROICA_LLM_MODEL", "default"),
                   api_key=os.environ.get("EROICA_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none",
                   timeout_seconds=float(os.environ.get("EROICA_LLM_TIMEOUT_SECONDS", "60")))


def prompt(ctx: Context, redact: Redactor) -> str:
    f = ctx.finding
    names = [n for n in (f.function, *(s.key.split(".")[-1] for s in f.settings)) if n]
    if f.root_cause == "dataloader_stall":
        names.append("DataLoader(")
    if f.root_cause == "gc_pause":
        names.append(".step()")
    code = relevant_code(ctx.repo, names) if ctx.repo is not None else {}
    ctx.allowed_files |= set(code)
    parts = [f"Root cause: {f.root_cause} on rank {', '.join(map(str, f.ranks))} (confidence {f.confidence:.2f}).",
             f"Summary: {f.summary}", "Evidence:", *(f"- {e}" for e in f.evidence[:8])]
    if f.settings:
        parts += ["Settings that differ from the peers:",
                  *(f"- {s.key} = {s.value} (peers: {s.peer_value})" for s in f.settings)]
    if ctx.remediation is not None:
        parts += [f"Known remediation: {ctx.remediation.guidance}"]
    for path, excerpt in code.items():
        parts += [f"File {path} (excerpt):", "```python", excerpt, "```"]
    return redact("\n".join(parts))


def _content(resp: Any) -> str:
    return str(resp.choices[0].message.content or "")


def llm(ctx: Context, settings: ModelSettings, redact: Redactor) -> Proposal:
    """Ask the model; every failure is a refusal with its reason, never an exception."""
    try:
        from openai import OpenAI
    except ImportError:
        return Proposal(kind="none", rationale="the openai package is not installed (pip install 'eroica[llm]')")
    ctx.sent = prompt(ctx, redact)
    try:
        client = OpenAI(base_url=settings.base_url, api_key=settings.api_key, timeout=settings.timeout_seconds,
                        max_retries=0)
        resp = client.chat.completions.create(
            model=settings.model, temperature=0, response_format={"type": "json_object"},
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ctx.sent}])
        text = _content(resp).strip()
    except Exception as exc:  # the endpoint: timeouts, HTTP errors, refused connections
        return Proposal(kind="none", rationale=f"the model endpoint failed: {type(exc).__name__}: {str(exc)[:200]}")
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        return Proposal.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError, TypeError) as exc:
        return Proposal(kind="none", rationale=f"the model's reply was not the structured form: {str(exc)[:200]}")
