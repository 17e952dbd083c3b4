"""The API's response documents, typed: FastAPI validates every response against them, and
`eroica schema api` publishes their JSON Schema (docs/schema/eroica.api.v1.schema.json)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eroica.schema.diagnosis import CulpritStory


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Job(Out):
    id: str                           # one run
    name: str | None = None           # the job's name, shared by its runs (restarts)
    ended_at: float | None = None     # its rank 0 said it ended, or it fell silent for --job-silent-seconds
    ended_by: str | None = None       # "job" or "silence"
    world_size: int
    hosts: list[str]
    first_seen: float                 # unix seconds
    last_seen: float
    confident_findings: int = 0       # findings at >= 0.5 in its windows


class Step(Out):
    """One summary of the job's always-on step-time series."""

    job_id: str
    first_step: int
    last_step: int
    median_seconds: float
    p90_seconds: float
    at: float


class Window(Out):
    pk: int
    job_id: str
    window_id: str
    world_size: int
    start_step: int
    end_step: int
    trigger: str
    status: str                       # collecting, ready, claimed, done, failed
    ranks_reported: int
    first_doc_at: float
    last_doc_at: float
    window_opened_at: float | None
    window_closed_at: float | None
    attempts: int                     # claims since its documents last changed (a late rank resets it)
    diagnoses_stored: int = 0         # diagnoses stored for it, ever (a late rank's re-diagnosis counts)
    diagnosed_at: float | None
    error: str | None
    seconds_to_diagnosis: float | None          # from the last rank's document
    seconds_close_to_diagnosis: float | None    # from the last rank's window close


class Finding(Out):
    id: int
    window_pk: int
    job_id: str
    root_cause: str
    category: str
    ranks: list[int]
    hosts: list[str]
    function: str | None
    confidence: float
    summary: str
    rule_ids: list[str]
    created_at: float
    devices: list[str]           # where the ranks run, "host/device" (none for findings stored before 0012)
    scope: str                   # "host": the host's problem, named once; "rank": the ranks'


class RawTrace(Out):
    rank: int
    host: str | None
    trace_bytes: int
    url: str                          # GET it: the Chrome trace JSON, for Perfetto or chrome://tracing


class JobWindow(Window):
    raw_traces: list[RawTrace]        # the window's kept raw traces (suspects and a healthy peer), if any


class JobDetail(Job):
    windows: list[JobWindow]
    steps: list[Step]
    # each confident cause over the job's latest windows: chronic, intermittent, rotating, transient or new
    story: list[CulpritStory] = Field(default_factory=list)


class WindowDetail(Window):
    findings: list[Finding]


class Issue(Out):
    """One finding's lifecycle across windows: one per job, root cause and ranks."""

    id: int
    job_id: str
    root_cause: str
    category: str
    ranks: str                        # "1,3"
    hosts: list[str]
    function: str | None
    first_seen: float
    last_seen: float
    windows_total: int
    top_confidence: float
    last_window_pk: int
    state: str                        # open, acknowledged, linked, recovered, not_recovered, false_positive
    history: list[dict[str, Any]]
    link_url: str | None
    link_kind: str | None
    alert_dirty: bool
    alert_state: str                  # none, delivered, failed, unrouted
    alert_attempts: int
    alert_error: str | None
    alert_sent_at: float | None
    alert_next_at: float | None
    alert_version: int = 0            # bumped whenever the alert must be (re)sent
    alert_claimed_by: str | None = None   # the replica sending it now, until alert_claim_until
    alert_claim_until: float | None = None
    # healthy_seconds, slow_seconds, current_seconds, recovered, recovered_from_step, accelerator_hours, band_ratio,
    # onset_after_step, onset_at, seconds_to_detect
    recovery: dict[str, Any] | None
    runs: list[str] | None = None     # the job's runs it was followed through (restarts), oldest first
    devices: list[str] | None = None  # "host/device" of its ranks ("node-7/cuda:3")


class Accepted(Out):
    window: int
    created: bool                     # False: the same document was already stored


API_MODELS: tuple[type[Out], ...] = (Job, JobDetail, Window, WindowDetail, Finding, Step, Accepted, Issue)
