"""What the assistant drafts: a proposal (a diff or a config change), a remediation template, and
the record of a draft that was refused. Frozen and typed like every other eroica document."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from eroica.assistant.errors import DraftInputError


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ConfigEdit(Frozen):
    key: str
    before: str
    after: str
    where: str = ""                     # the rank(s) or file the key is set on


class Proposal(Frozen):
    """A backend's answer: a unified diff, a config change, or nothing (a human must write it)."""

    kind: Literal["diff", "config", "none"]
    diff: str = ""
    config: list[ConfigEdit] = Field(default_factory=list)
    rationale: str = ""


class LineEdit(Frozen):
    """A model's edit: lines `start_line`-`end_line` of the target's file (1-based, inclusive) become
    `replacement` (empty: they are deleted). Line numbers, not a diff: a model copies numbered lines
    far more reliably than it writes hunk headers, and the server's schema holds the numbers to the
    target's lines."""

    start_line: int
    end_line: int
    replacement: str


class ModelReply(Frozen):
    """What a model replies (the schema the server enforces): one line edit of the target, a config
    change, or nothing and a next step. The backend turns the edit into the Proposal's diff."""

    kind: Literal["edit", "config", "none"]
    edit: LineEdit | None = None
    config: list[ConfigEdit] = Field(default_factory=list)
    rationale: str = ""


class Remediation(Frozen):
    """A remediation template from knowledge/remediations/<id>.yaml (SRE-authored data)."""

    id: str
    root_causes: list[str]
    title: str
    action: Literal["dataloader_kwargs", "gc_freeze", "align_settings", "anomaly_off", "move_blocking_call",
                    "balanced_sampler", "async_checkpoint", "guidance"]
    params: dict[str, Any] = Field(default_factory=dict)
    risk: str
    guidance: str
    rollback: str


def load_remediations(directory: Path) -> dict[str, Remediation]:
    out = {}
    for f in sorted(directory.glob("*.yaml")):
        r = Remediation.model_validate(yaml.safe_load(f.read_text()))
        if r.id != f.stem:
            raise DraftInputError(f"{f}: id {r.id!r} must be the file name ({f.stem})")
        out[r.id] = r
    return out


class Verification(Frozen):
    """What re-running the job measured with a draft applied, beside the same command on the unchanged
    code (`eroica draft --verify CMD`). Step: the median of every rank's steps from the slowdown's onset
    on outside every profiling window (else in the re-run's window), the median re-run's; healthy: the
    job's step before the slowdown (assistant/verify.py says where each is measured)."""

    verified: bool
    command: str
    summary: str                               # "step 160 ms -> 63 ms; healthy 61 ms; ..."
    why: str | None = None                     # what kept it from being verified
    before_step_seconds: float | None = None
    after_step_seconds: float | None = None
    healthy_step_seconds: float | None = None
    healthy_from: str = ""                     # where the healthy step was measured
    step_from: str = ""                        # which steps of the re-runs the step is the median of
    step_to_healthy_ratio: float | None = None  # what the verdict judged (paired: the median run's own ratio)
    function: str | None = None
    before_function_seconds: float | None = None   # the finding's function on its ranks, per step
    after_function_seconds: float | None = None
    tolerance_ratio: float = 0.1               # the step within this much of healthy: verified (at most 0.15)
    harm_ratio: float = 0.2                    # the draft's healthy steps at most this much slower than the unchanged's
    spread_ratio: float | None = None          # paired: one re-run's spread of its step over its own healthy steps
    runs: int = 1                              # the re-runs on each side (`--verify-runs`)
    required: str = ""                         # what the verdict asked of the re-runs, in words with its numbers
    run_ratios: tuple[float, ...] = ()         # paired: each re-run with the draft, its step over its own healthy steps
    unchanged_ratio: float | None = None       # paired: the unchanged code's median run, the same ratio


class DraftOutcome(Frozen):
    """One finding's outcome: what was written, or why nothing could be drafted."""

    finding: str                         # "<root_cause> on rank <r>"
    kind: Literal["code", "config", "ticket", "human"]
    directory: str
    backend: str
    refusal: str | None = None           # why the draft was discarded (then a human writes the fix)
    sent_to_model: bool = False
    root_cause: str = ""
    ranks: list[int] = Field(default_factory=list)
    windows: list[str] = Field(default_factory=list)       # every window that found it (one request for all)
    target: str | None = None                              # file:line the evidence located, if any
    checks: list[str] = Field(default_factory=list)        # the gate's checks that passed
    verification: Verification | None = None               # --verify: the re-run's measurement
