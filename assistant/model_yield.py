"""`eroica eval --drafts --base-url URL`: what a model drafts for the findings templates cannot fix
well. Every recorded finding of a cause no template fixes (`unknown`, `transient_stall`) and every
`user_code` finding is sent to the model against every training repository under `incidents/repos/`
(the finding's sites as the collector records them there), and its reply goes through the same gate
`eroica draft` uses: scope, apply, compile, the repository's validation. Counted apart from the
templates' yield, by outcome: a draft the gate accepted, a reply of kind "none" (the model's next
step), a draft the gate refused (by reason), no code to send (the repository has no target for it),
or a failure: the endpoint's, a reply cut at max_tokens or not of the structured form, or a gate check
that could not run (the diff did not apply, no sandbox for the validation). Only the first three reach
the gate's judgement of what the model wrote."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eroica.assistant.backends import MODEL_CAUSES, Context, ModelSettings, llm
from eroica.assistant.draft_yield import find_repos
from eroica.assistant.gate import check
from eroica.assistant.models import load_remediations
from eroica.assistant.redact import Redactor
from eroica.engine import DiagnoseOptions, diagnose, find_incidents
from eroica.engine.rules import builtin_knowledge_dir
from eroica.schema.diagnosis import Finding

CAUSES = (*MODEL_CAUSES, "user_code")


@dataclass
class ModelCase:
    incident: str
    repo: str
    cause: str
    function: str | None
    outcome: str             # accepted, next_step, refused, no_target, failed
    detail: str


@dataclass
class ModelEval:
    cases: list[ModelCase] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        return Counter(c.outcome for c in self.cases)


def model_findings(incidents: Path) -> list[tuple[str, Finding]]:
    """(incident, finding) for each cause the model drafts for, once per cause and function of an
    incident (an `unknown` finding at any confidence: it is where no rule concluded)."""
    out, opts = [], DiagnoseOptions(in_process=True)
    for inc in find_incidents(incidents):
        seen = set()
        for w in diagnose(inc / "patterns", opts).windows:
            for f in w.findings:
                key = (f.root_cause, f.function)
                if f.root_cause not in CAUSES or key in seen or (f.root_cause != "unknown" and f.confidence < 0.5):
                    continue
                seen.add(key)
                out.append((inc.name, f))
    return out


#: a proposal's rationale (kind none) that is no reply of the model's: its endpoint failed, or its reply was cut at
#: max_tokens, not the structured form, or an edit of no line of the target (eroica.assistant.backends.llm)
REPLY_FAILED = ("the model endpoint failed", "the model's reply", "the openai")
#: a gate refusal that judged nothing the draft changes: a check could not run (eroica.assistant.gate.check_diff)
GATE_FAILED = re.compile(r"^(the diff does not apply|git apply could not run"
                         r"|the repository's validation `[^`]*` was not run)")


def unreached(why: str) -> str | None:
    """The outcome of a refusal (or a kind-none proposal's rationale) that never reached the gate's checks of
    what the model wrote: "no_target" (nothing was sent), "failed" (the endpoint, the reply's form or
    length, a gate check that could not run); None when it did (a content check refused it, or the model
    replied with a next step)."""
    if why.startswith("no target"):
        return "no_target"
    return "failed" if why.startswith(REPLY_FAILED) or GATE_FAILED.match(why) else None


def _outcome(p_kind: str, rationale: str, refusal: str | None) -> tuple[str, str]:
    if p_kind == "none":
        return unreached(rationale) or "next_step", rationale
    if refusal is None:
        return "accepted", ""
    return unreached(refusal) or "refused", refusal


def model_yield(incidents: Path, repos_root: Path, settings: ModelSettings, validate: bool = True,
                progress: Callable[[str], None] | None = None) -> ModelEval:
    rems = load_remediations(builtin_knowledge_dir() / "remediations")
    by_cause = {c: r for r in rems.values() for c in r.root_causes}
    repos, findings = find_repos(repos_root), model_findings(incidents)
    out = ModelEval()
    total = len(repos) * len(findings)
    for inc, f in findings:
        for repo in repos:
            ctx = Context(finding=f.model_copy(update={"sites": repo.sites}), remediation=by_cause.get(f.root_cause),
                          repo=repo.path)
            p = llm(ctx, settings, Redactor.for_site(hostnames=list(f.hosts)))
            gate = check(p, repo.path, ctx.scope(), None if validate else "true")
            kind, detail = _outcome(p.kind, p.rationale, gate.refusal)
            out.cases.append(ModelCase(inc, repo.name, f.root_cause, f.function, kind, detail))
            if progress is not None:
                progress(f"model {len(out.cases)}/{total}: {inc} {f.root_cause} on {repo.name}: {kind}")
    return out


def table(ev: ModelEval, each: bool = False) -> str:
    """The counts by outcome, the refusals' and failures' reasons, a few next steps; with `each`, one line
    per (finding, repository) pair."""
    n = ev.counts()
    lines = [f"model drafts: {len(ev.cases)} (finding, repository) pairs of {', '.join(CAUSES)}",
             f"  accepted by the gate: {n['accepted']} (not re-run here: the corpus's repositories do not "
             "reproduce a slowdown; `eroica draft --verify CMD` re-runs a job with a draft)",
             f"  next step instead of a change (kind none): {n['next_step']}",
             f"  refused by the gate's checks of the draft: {n['refused']}",
             f"  nothing sent (no target in the repository): {n['no_target']}",
             f"  failures (the endpoint; a reply cut, unparsed or off the target; a gate check that could not run): "
             f"{n['failed']}"]
    for outcome in ("refused", "failed"):
        why = Counter(f"{c.cause}: {c.detail.split(':')[0][:100]}" for c in ev.cases if c.outcome == outcome)
        lines += [f"    {outcome}, because {w} ({k})" for w, k in why.most_common(8)]
    steps = [c for c in ev.cases if c.outcome == "next_step"][:5]
    lines += [f"    next step ({c.cause} on {c.repo}): {c.detail[:160]}" for c in steps]
    if each:
        lines += [f"  {c.incident} {c.cause} ({c.function}) on {c.repo}: {c.outcome}"
                  + (f": {' '.join(c.detail.split())[:200]}" if c.detail else "") for c in ev.cases]
    return "\n".join(lines)
