"""Two ways to draft: `offline` (deterministic, from the remediation templates) and `openai` (any
OpenAI-compatible endpoint through the official client). Both return a Proposal; neither applies
anything. The model backend never raises: every failure becomes a Proposal of kind "none" whose
rationale says why (the draft is then refused and a human writes the fix)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from eroica.assistant import edits, targets
from eroica.assistant.errors import BackendConfigError
from eroica.assistant.gate import Scope
from eroica.assistant.models import ConfigEdit, ModelReply, Proposal, Remediation
from eroica.assistant.redact import Redactor
from eroica.schema.diagnosis import Finding


class CodeAction(NamedTuple):
    """A fix drafted in the code: where it goes, and the edit (the file's text, the located node
    and the template's params -> the new text)."""

    locate: Callable[[Path, Finding], targets.Target]
    draft: Callable[[str, targets.Candidate, dict[str, Any]], str]


CODE_ACTIONS: dict[str, CodeAction] = {
    "dataloader_kwargs": CodeAction(targets.loader, lambda text, c, p: edits.loader_kwargs(
        text, c, int(p.get("num_workers", 4)), int(p.get("prefetch_factor", 4)), pin="cuda" in text)),
    "balanced_sampler": CodeAction(targets.sampler, lambda text, c, p: edits.balanced_sampler(text, c)),
    "gc_freeze": CodeAction(targets.loop, lambda text, c, p: edits.gc_freeze(
        text, c, int(p.get("gen0_threshold", 50_000)))),
    "anomaly_off": CodeAction(targets.anomaly, lambda text, c, p: edits.anomaly_off(text, c)),
    "move_blocking_call": CodeAction(targets.region, lambda text, c, p: edits.to_background(text, c)),
    "async_checkpoint": CodeAction(targets.checkpoint, lambda text, c, p: edits.async_checkpoint(text, c)),
}
ANOMALY_KEY = "detect_anomaly"
#: causes no template fixes in code: a model gets the code the evidence points at (and the recorded
#: stacks) and proposes a change there or a concrete next step
MODEL_CAUSES = ("unknown", "transient_stall")
#: causes whose function is work the job wants done (the user's own call, its checkpoint): a draft may
#: move it off the step or call it less often, never delete it (the gate refuses a draft that does)
KEEP_CAUSES = ("user_code", "slow_storage")


def action_of(f: Finding, rem: Remediation | None) -> str | None:
    """The fix for this finding: the template's action; a differing anomaly-detection setting is
    turned off where the code or config turns it on (not aligned rank by rank)."""
    if rem is None:
        return None
    if rem.action == "align_settings" and any(ANOMALY_KEY in s.key for s in f.settings):
        return "anomaly_off"
    return rem.action


@dataclass
class Context:
    """What a backend may use: the finding, its remediation template, the repository, and the
    target located from the evidence before any backend runs (its scope bounds every draft)."""

    finding: Finding
    remediation: Remediation | None
    repo: Path | None
    target: targets.Target | None = None
    sent: str = ""                                           # what was sent to a model, verbatim
    model_only: bool = False                                 # the target is the model's, no template's

    def __post_init__(self) -> None:
        action = action_of(self.finding, self.remediation)
        if self.repo is not None and action in CODE_ACTIONS:
            self.target = CODE_ACTIONS[action].locate(self.repo, self.finding)
        if self.repo is not None and self.finding.root_cause in MODEL_CAUSES and (
                self.target is None or self.target.found is None):
            # no template's target: the model alone may draft, where the evidence points
            self.target, self.model_only = targets.for_model(self.repo, self.finding), True

    @property
    def action(self) -> str | None:
        return action_of(self.finding, self.remediation)

    def scope(self) -> Scope:
        keys = {s.key for s in self.finding.settings}
        t = self.target
        if t is None or t.found is None:
            return Scope(keys=frozenset(keys))
        fn = self.finding.function or ""
        keeps = frozenset({fn} if fn.isidentifier() and self.finding.root_cause in KEEP_CAUSES else ())
        return Scope(lines={t.found.file: [(t.found.line, t.found.end_line)]}, keys=frozenset(keys), keeps=keeps)


SATURATED = 0.8      # data.loader-saturated: workers busy this share of their time have no headroom left
BLOCKED = 0.3        # a share of the workers' time in D state or in the run queue that names another cause


def more_workers(f: Finding) -> tuple[str | None, str]:
    """May a loader get more workers? (refusal or None, the evidence that decided). A loader whose
    workers were sampled already runs in parallel: more workers help only when they have no headroom
    left and are not held by the disk or by CPUs they share."""
    sig = {s.signal: s.value for s in f.signals}
    busy = sig.get("loader_worker_busy_ratio")
    if busy is None:
        return None, "no loader workers were sampled on the rank: it loads its batches in the training process"
    io, rq = sig.get("loader_worker_io_wait_ratio", 0.0), sig.get("loader_worker_runqueue_wait_ratio", 0.0)
    said = (f"its loader workers are busy {busy:.0%} of their time, in D state {io:.0%}, waiting for a CPU "
            f"{rq:.0%}")
    if io >= BLOCKED:
        return f"{said}: more workers would queue more reads on the same device (a storage problem)", said
    if rq >= BLOCKED:
        return f"{said}: more workers would crowd the CPUs they already wait for (contention)", said
    if busy < SATURATED:
        return (f"{said}: the loader is already parallel and its workers have headroom, so more of them would "
                "wait too; the rank waits elsewhere in its input pipeline (collate, transfer, its own process)"), said
    return None, said


def _code(ctx: Context, rem: Remediation, action: CodeAction) -> Proposal:
    t, repo = ctx.target, ctx.repo
    if repo is None:
        return Proposal(kind="none", rationale="no repository given (--repo): the code cannot be drafted")
    evidence = ""
    if ctx.action == "dataloader_kwargs":
        refused, evidence = more_workers(ctx.finding)
        if refused is not None:
            return Proposal(kind="none", rationale=f"no more loader workers: {refused}")
        evidence = f" Evidence: {evidence}."
    if t is None or t.found is None:
        return Proposal(kind="none", rationale=f"no target: {t.why if t else 'nothing located'}")
    c, p = t.found, rem.params
    text = edits.read(repo, c.file)
    try:   # anomaly detection turned on by a config key is turned off there, not in the code
        new = edits.config_off(text, c) if t.kind == "anomaly_config" else action.draft(text, c, p)
    except edits.NotDrafted as exc:
        return Proposal(kind="none", rationale=f"{c}: {exc}")
    if new == text:
        return Proposal(kind="none", rationale=f"{c}: already as the fix would make it")
    return Proposal(kind="diff", rationale=f"{rem.title}. Target: {c} ({t.why}).{evidence}",
                    diff=edits.unified_diff(c.file, text, new))


def offline(ctx: Context) -> Proposal:
    rem, f = ctx.remediation, ctx.finding
    if rem is None:
        return Proposal(kind="none", rationale=f"no remediation template for {f.root_cause}")
    if ctx.model_only:
        return Proposal(kind="none", rationale=f"{rem.title}: no template's target in the code; a person (or "
                        f"--backend openai) must judge it ({rem.guidance})")
    if ctx.action in CODE_ACTIONS:
        return _code(ctx, rem, CODE_ACTIONS[ctx.action])
    if rem.action == "align_settings":
        if not f.settings:
            return Proposal(kind="none", rationale="the finding names no setting that differs from the peers")
        return Proposal(kind="config", rationale=rem.title, config=[
            ConfigEdit(key=s.key, before=s.value, after=s.peer_value,
                       where=_where(ctx.repo, s.key) or f"the launch settings of rank {', '.join(map(str, f.ranks))}")
            for s in f.settings])
    return Proposal(kind="none", rationale=f"{rem.title}: this needs a person's judgement ({rem.guidance})")


def _where(repo: Path | None, key: str) -> str | None:
    """The config file and line that sets the key, when the repository has exactly one."""
    if repo is None:
        return None
    found = targets.config_keys(repo, re.escape(key.split(".")[-1]), r"\S+")
    return f"{found[0].file}:{found[0].line}" if len(found) == 1 else None


SYSTEM = (
    "You draft fixes for slow distributed training jobs. Reply with one JSON object only: "
    '{"kind": "edit" | "config" | "none", "edit": {"start_line": <first line replaced>, "end_line": <last line '
    'replaced>, "replacement": "<the new text of those lines, indented as the code is, without line numbers; '
    'empty deletes them>"}, "config": [{"key": "...", "before": "...", "after": "..."}], '
    '"rationale": "<one sentence>"}. '
    "Change only the target lines; never add network calls, subprocesses or secrets."
)


def _edit(lines: list[int] | None) -> dict[str, Any]:
    number: dict[str, Any] = {"type": "integer"} if lines is None else {"type": "integer", "enum": lines}
    return {"type": "object",
            "properties": {"start_line": number, "end_line": number, "replacement": {"type": "string"}},
            "required": ["start_line", "end_line", "replacement"], "additionalProperties": False}


def _config(keys: list[str] | None) -> dict[str, Any]:
    key: dict[str, Any] = {"type": "string"} if keys is None else {"type": "string", "enum": keys}
    return {"type": "array", "items": {
        "type": "object", "properties": {"key": key, "before": {"type": "string"}, "after": {"type": "string"}},
        "required": ["key", "before", "after"], "additionalProperties": False}}


def reply_schema(ctx: Context | None = None) -> dict[str, Any]:
    """The reply's JSON schema (a ModelReply), which the server enforces while the model writes (llama.cpp
    compiles it to a grammar): even a small model's reply parses. One edit, not a list: the smallest
    change is one span of the target (a small model writes several overlapping ones when it may). With a
    finding in hand, the reply may only be what it allows: an edit only of the located target's line
    numbers, a config change only of the keys the finding names, so what reaches the gate is judged on
    what it changes, not on where it points. Only what strict schemas everywhere accept (no length or
    numeric bounds): every property required, enums, no extra properties."""
    props: dict[str, Any] = {"rationale": {"type": "string"}}
    kinds = ["none"]
    scope = ctx.scope() if ctx is not None else None          # what the gate will allow, and so the model
    lines = None if scope is None else [n for spans in scope.lines.values() for lo, hi in spans
                                        for n in range(lo, hi + 1)]
    if lines is None or lines:
        kinds.insert(0, "edit")
        props["edit"] = _edit(lines)
    keys = None if scope is None else sorted(scope.keys)
    if keys is None or keys:
        kinds.insert(-1, "config")
        props["config"] = _config(keys)
    props = {"kind": {"type": "string", "enum": kinds}, **props}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


RESPONSE_FORMATS = ("json_schema", "json_object")


def response_format(kind: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's form (`json_schema`: hosted APIs, vLLM, llama-server), or `json_object` with the schema
    beside it (llama-cpp-python's server, which refuses the other)."""
    schema = schema if schema is not None else reply_schema()
    if kind == "json_object":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": "proposal", "strict": True, "schema": schema}}


@dataclass
class ModelSettings:
    base_url: str
    model: str
    api_key: str
    timeout_seconds: float = 60.0
    max_tokens: int = 1024
    response_format: str = "json_schema"          # or json_object (llama-cpp-python's server)

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None) -> ModelSettings:
        url = base_url or os.environ.get("EROICA_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not url:
            raise BackendConfigError("the openai backend needs an endpoint: --base-url or EROICA_LLM_BASE_URL "
                             "(any OpenAI-compatible server: vLLM, llama.cpp server, Ollama, a hosted API)")
        form = os.environ.get("EROICA_LLM_RESPONSE_FORMAT", "json_schema")
        if form not in RESPONSE_FORMATS:
            raise BackendConfigError(f"EROICA_LLM_RESPONSE_FORMAT={form!r}: one of {', '.join(RESPONSE_FORMATS)} "
                                     "(json_object for llama-cpp-python's server)")
        return cls(base_url=url, model=model or os.environ.get("EROICA_LLM_MODEL", "default"),
                   api_key=os.environ.get("EROICA_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none",
                   timeout_seconds=float(os.environ.get("EROICA_LLM_TIMEOUT_SECONDS", "60")), response_format=form,
                   max_tokens=int(os.environ.get("EROICA_LLM_MAX_TOKENS", "1024")))


def prompt(ctx: Context, redact: Redactor) -> str:
    f, t = ctx.finding, ctx.target
    parts = [f"Root cause: {f.root_cause} on rank {', '.join(map(str, f.ranks))} (confidence {f.confidence:.2f}).",
             f"Summary: {f.summary}", "Evidence:", *(f"- {e}" for e in f.evidence[:8])]
    if f.settings:
        parts += ["Settings that differ from the peers:",
                  *(f"- {s.key} = {s.value} (peers: {s.peer_value})" for s in f.settings)]
    if ctx.remediation is not None:
        parts += [f"Known remediation: {ctx.remediation.guidance}"]
    if ctx.repo is not None:
        for name, frames in targets.recorded_stacks(ctx.repo, f):
            parts += [f"Recorded call stack at `{name}` (innermost first):",
                      *(f"- {rel}:{line}: {code}" for rel, line, code in frames)]
    if f.root_cause in MODEL_CAUSES:
        parts += ["No template fixes this cause. Propose the smallest change inside the target lines that "
                  "removes the excess, or reply with kind \"none\" and, as the rationale, one concrete next "
                  "step (what to measure or change, and where)."]
    if t is not None and t.found is not None and ctx.repo is not None:
        lines = edits.read(ctx.repo, t.found.file).splitlines()
        lo, hi = max(t.found.line - 8, 1), min(t.found.end_line + 8, len(lines))
        parts += [f"Change only lines {t.found.line}-{t.found.end_line} of {t.found.file} (the target): reply with "
                  "an edit that replaces whole lines by their numbers (the numbers are not part of the code). "
                  f"Lines {lo}-{hi}:", "```python",
                  *(f"{i}: {lines[i - 1]}" for i in range(lo, hi + 1)), "```"]
    return redact("\n".join(parts))


def _content(resp: Any) -> str:
    return str(resp.choices[0].message.content or "")


def llm(ctx: Context, settings: ModelSettings, redact: Redactor) -> Proposal:
    """Ask the model; every failure is a refusal with its reason, never an exception."""
    try:
        from openai import OpenAI
    except ImportError:
        return Proposal(kind="none", rationale="the openai package is not installed (pip install 'eroica[llm]')")
    if (ctx.action in CODE_ACTIONS or ctx.model_only) and (ctx.target is None or ctx.target.found is None):
        return Proposal(kind="none", rationale=f"no target: {ctx.target.why if ctx.target else 'no --repo'}; "
                        "nothing was sent to the model")
    ctx.sent = prompt(ctx, redact)
    try:
        client = OpenAI(base_url=settings.base_url, api_key=settings.api_key, timeout=settings.timeout_seconds,
                        max_retries=0)
        resp = client.chat.completions.create(  # type: ignore[call-overload]
            model=settings.model, temperature=0, seed=0, max_tokens=settings.max_tokens,
            response_format=response_format(settings.response_format, reply_schema(ctx)),
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ctx.sent}])
        text = _content(resp).strip()
        cut = getattr(resp.choices[0], "finish_reason", None) == "length"
    except Exception as exc:  # the endpoint: timeouts, HTTP errors, refused connections
        return Proposal(kind="none", rationale=f"the model endpoint failed: {type(exc).__name__}: {str(exc)[:200]}")
    if cut:
        return Proposal(kind="none", rationale=f"the model's reply was cut at max_tokens ({settings.max_tokens}, "
                        f"EROICA_LLM_MAX_TOKENS) before it was complete; it began: {text[:200]!r}")
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:   # strict=False: a raw newline inside a string (a small model's code) is still the schema's form
        reply = ModelReply.model_validate(json.loads(text, strict=False))
    except (json.JSONDecodeError, ValidationError, TypeError) as exc:
        why = str(exc).splitlines()[0][:120]
        return Proposal(kind="none", rationale=f"the model's reply was not the structured form ({why}); "
                        f"it began: {text[:300]!r}")
    return proposal_of(reply, ctx)


NUMBERED = re.compile(r"^\d+: ?")


def proposal_of(reply: ModelReply, ctx: Context) -> Proposal:
    """A model's reply as a Proposal: its line edit applied to the target's file, as a unified diff for
    the gate (which judges scope, compilation and validation). Lines copied with the prompt's numbers
    lose them (`47:     x = 1` is no Python line)."""
    if reply.kind != "edit":
        return Proposal(kind=reply.kind, config=reply.config, rationale=reply.rationale)
    t, e = ctx.target, reply.edit
    if ctx.repo is None or t is None or t.found is None:
        return Proposal(kind="none", rationale="the model's reply edits lines, but no target was located")
    if e is None:
        return Proposal(kind="none", rationale="the model's reply is an edit with no lines")
    text = edits.read(ctx.repo, t.found.file)
    lines = text.splitlines(keepends=True)
    if not 1 <= e.start_line <= e.end_line <= len(lines):    # a server that did not hold the model to the schema
        return Proposal(kind="none", rationale=f"the model's reply edits lines {e.start_line}-{e.end_line}, "
                        f"not lines of {t.found.file} ({len(lines)} lines)")
    new = e.replacement.splitlines()
    if new and all(NUMBERED.match(ln) for ln in new if ln.strip()):
        new = [NUMBERED.sub("", ln, count=1) for ln in new]
    lines[e.start_line - 1:e.end_line] = [ln + "\n" for ln in new]
    return Proposal(kind="diff", rationale=reply.rationale,
                    diff=edits.unified_diff(t.found.file, text, "".join(lines)))
