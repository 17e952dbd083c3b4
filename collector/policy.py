"""The trigger policy: one validated config for when a profiling window opens."""

from __future__ import annotations

import fnmatch
import os
from typing import Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


def first_error(exc: ValidationError, whole: str = "(policy)") -> str:
    """`field a.b: why` for the first problem of a validation error (`whole` when it is not one field's)."""
    err = exc.errors()[0]
    return f"field {'.'.join(str(x) for x in err['loc']) or whole}: {err['msg']}"


class TriggerPolicy(BaseModel):
    """When the step-time detector opens a window, and how long it lasts.

    Defaults follow public practice (skip warm-up steps, robust baseline, several consecutive
    breaches, a cooldown) and are tuned for short CPU jobs; production jobs raise `warmup_steps`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    warmup_steps: int = Field(10, ge=0, description="steps ignored at start (compilation, caches)")
    baseline_steps: int = Field(
        20, ge=8, description="reference steps (median/MAD), taken before the recent steps"
    )
    recent_steps: int = Field(8, ge=3, description="recent steps judged together by the sustained test")
    threshold_mad: float = Field(5.0, gt=0, description="fast test: step > median + k * 1.4826 * MAD ...")
    threshold_min_ratio: float = Field(1.15, gt=1.0, description="... and step > median * ratio")
    consecutive_breaches: int = Field(3, ge=1, description="fast test: breaches in a row before a window opens")
    sustained_mad: float = Field(
        3.0, gt=0, description="sustained test: recent trimmed mean > reference + k * sigma / sqrt(n) ..."
    )
    sustained_min_ratio: float = Field(1.08, gt=1.0, description="... and > reference * ratio")
    lead_steps: int = Field(
        8, ge=1, description="steps between agreement and window start: >= poll_every_steps + 3 so every rank "
        "sees it (ranks may be 2 steps apart, and a poll's answer arrives a step later)"
    )
    window_steps: int = Field(10, ge=2, description="steps profiled per window")
    max_window_steps: int = Field(
        40, ge=2, description="a window opened on a periodic slowdown covers one whole period (+1 step), "
        "at most this many steps"
    )
    cooldown_steps: int = Field(20, ge=0, description="steps after a window before the detector re-arms")
    rearm_windows: int = Field(
        3, ge=1, description="windows opened against the last healthy reference while a slowdown persists "
        "(a window buys no silence); after the last, the slower level is taken as the new normal"
    )
    max_windows_per_hour: int = Field(6, ge=0, description="windows that found the job slow, per hour")
    quiet_backoff_steps: int = Field(
        8, ge=0, description="a detector window after which the job ran no slower than the reference it fired "
        "against (quiet: the slowdown had passed, judged on the recent_steps after it) is not counted in "
        "max_windows_per_hour; after it, a firing "
        "must hold this many judged steps in a row, four times as many after each further quiet window "
        "within quiet_memory_hours (0: off, every window counted and no backoff)")
    quiet_backoff_max_steps: int = Field(
        64, ge=1, description="the most judged steps in a row a firing must hold after quiet windows")
    quiet_memory_hours: float = Field(
        6.0, gt=0, description="how long a quiet window backs the detector off (a machine's noise is a "
        "property of where the job runs, for hours)")
    sample_interval_seconds: float = Field(
        0.02, gt=0, le=1.0, description="hardware sampler period (each sample costs a helper of the rank's own "
        "~0.2 ms of CPU with cold caches: 20 ms is ~0.9% of a core per rank while a window is open, ~0.6% on "
        "the host's one helper with 4 ranks)")
    nic_sample_interval_seconds: float = Field(
        0.001, ge=0, le=1.0, description="fast NIC byte-counter sampling during the window (0 = off), on the "
        "links the job's connections use (not loopback)"
    )
    nic_sample_duty_ratio: float = Field(
        0.25, gt=0, le=1.0, description="share of the window the fast NIC sampling runs, in 50 ms bursts at "
        "random pauses (every 1 ms wake-up costs the helper ~35 us: 3.5% of a core per rank at 1.0, ~0.9% at "
        "0.25); a burst's samples are as fine as ever, so a link's signature keeps its shape")
    sampler_scope: Literal["host", "rank"] = Field(
        "host", description="host: one sampler helper per host and user ticks every local rank's sampler "
        "(one wake-up per tick for the host, not one per rank: on 4 ranks a third less helper CPU per rank "
        "over loopback, half over real links, where each rank's link is also sampled at ~1 kHz); "
        "rank: a helper per rank (a fault in one helper touches one rank). A rank that cannot reach the "
        "host helper samples on its own")
    stack_sample_interval_seconds: float = Field(
        0.01, ge=0, le=1.0, description="while a window is open, how often the training thread's innermost "
        "user frame is read (0 = off): time no recorded function holds is named after the user's function "
        "that spent it (eroica.collector.stack_sampler); one frame walk per sample, in the rank's own process")
    max_events: int = Field(200_000, ge=1000, description="cap on function executions kept per window")
    poll_every_steps: int = Field(
        4, ge=1, description="how often ranks check the store for a planned window (one store round trip)"
    )
    max_window_seconds: float = Field(
        120.0, gt=0, description="a window still open after this long closes at the next step (a stalled job)"
    )
    control_poll_steps: int = Field(
        16, ge=1, description="how often ranks read runtime-control changes from the store (one round trip)"
    )
    control_lead_steps: int = Field(
        40, ge=3, description="steps between publishing a control change and every rank applying it"
    )
    gather_timeout_seconds: float = Field(
        60.0, gt=0, description="Monitor(gather=True): how long rank 0 waits for every rank's patterns (a rank gone)"
    )
    close_timeout_seconds: float = Field(
        10.0, ge=0, description="at Monitor.close(): how long to wait for pattern writes still pending"
    )
    op_detail: Literal["light", "framework", "all"] = Field(
        "light", description="light: on a rank without CUDA, no profiler session: framework functions, user "
        "regions and Python-called collectives timed by eroica's wrappers, the backward pass as one function "
        "with its autograd nodes counted by type; a CUDA rank uses framework. framework: the profiler's "
        "module/optimizer/collective wrappers, autograd nodes one by one, user regions (a tenth of the "
        "events). all: every aten operator too, at the profiler's full cost"
    )
    keep_raw_trace: Literal["off", "suspects", "all"] = Field(
        "suspects", description="a bounded Chrome trace of the window, kept by: the suspected ranks and one "
        "healthy peer, elected in the job through its store (eroica.collector.raw_keep); every rank; or none. "
        "true and false still mean all and off"
    )
    raw_trace_max_bytes: int = Field(2 * 1024 * 1024, ge=0, description="per rank and window; a larger trace "
                                     "is not kept (a gap says so)")
    raw_trace_max_ranks: int = Field(3, ge=1, description="suspects: ranks per window that keep theirs")
    raw_trace_wait_seconds: float = Field(30.0, gt=0, description="suspects: how long a rank waits for the "
                                          "keep decision before it deletes its spooled trace")
    enabled: bool = True
    eligible_jobs: tuple[str, ...] = Field(
        ("*",), description="job names (shell patterns) the detector watches; the name comes from "
        "Monitor(job=...), EROICA_JOB_NAME, SLURM_JOB_NAME or TORCHELASTIC_RUN_ID (none: '')"
    )
    min_world_size: int = Field(1, ge=1, description="jobs with fewer ranks are not watched by the detector")
    hang_enabled: bool = Field(True, description="the hang watchdog (a thread outside the training thread)")
    hang_suspect_seconds: float = Field(
        20.0, gt=0, description="hang: no step for this long (and for hang_suspect_factor x the recent median step) is "
        "a suspected hang: every rank records where it stands, and the verdict's confidence follows how far the stall "
        "exceeds the job's own longest healthy pause so far")
    hang_suspect_factor: float = Field(
        5.0, gt=1.0, description="hang: a suspicion waits at least this many times the recent median step")
    hang_factor: float = Field(
        20.0, gt=1.0, description="hang: confirmed after no step for this many times the recent median step ...")
    hang_floor_seconds: float = Field(
        300.0, gt=0, description="... and for at least this long ...")
    hang_pause_margin: float = Field(
        1.5, ge=1.0, description="... and for this many times the job's longest healthy pause so far (its longest "
        "step: a checkpoint, an evaluation pass), so a pause the job has made before is never confirmed as a hang")
    hang_poll_seconds: float = Field(1.0, gt=0, le=10.0, description="how often the watchdog looks")
    hang_native_dump: bool = Field(
        True, description="hang: arm faulthandler's C thread as a dead man's switch, so a training thread that "
        "holds the GIL inside C code is still located (it takes over faulthandler.dump_traceback_later)")

    def window_length(self, period_steps: int | None = None) -> int:
        """Steps a window profiles: the policy's, or one whole period (+1 step) of a periodic
        slowdown, at most `max_window_steps`."""
        if not period_steps:
            return self.window_steps
        return min(max(self.window_steps, period_steps + 1), self.max_window_steps)

    def eligible(self, job_name: str, world_size: int) -> str | None:
        """None when the detector should watch this job, else why not (requested windows still open)."""
        if world_size < self.min_world_size:
            return f"world size {world_size} < min_world_size {self.min_world_size}"
        if not any(fnmatch.fnmatchcase(job_name, pat) for pat in self.eligible_jobs):
            return f"job {job_name!r} matches none of eligible_jobs {list(self.eligible_jobs)}"
        return None

    @model_validator(mode="before")
    @classmethod
    def _raw_trace_bool(cls, data: object) -> object:
        """keep_raw_trace was a bool: true keeps every rank's, false none."""
        if isinstance(data, dict):
            v = data.get("keep_raw_trace")
            if isinstance(v, bool) or (isinstance(v, str) and v.strip().lower() in ("1", "0", "true", "false")):
                on = v if isinstance(v, bool) else v.strip().lower() in ("1", "true")
                data = {**data, "keep_raw_trace": "all" if on else "off"}
        return data

    @model_validator(mode="after")
    def _check(self) -> TriggerPolicy:
        if self.lead_steps < self.poll_every_steps + 3:
            raise ValueError(
                f"lead_steps ({self.lead_steps}) must be >= poll_every_steps + 3 ({self.poll_every_steps + 3}): "
                "ranks poll the store every poll_every_steps, may be up to 2 steps apart, and see an answer "
                "a step after they asked"
            )
        if self.control_lead_steps < self.control_poll_steps + 2:
            raise ValueError(
                f"control_lead_steps ({self.control_lead_steps}) must be >= control_poll_steps + 2 "
                f"({self.control_poll_steps + 2}): every rank must read a change before it applies"
            )
        return self

    @classmethod
    def from_env(cls, base: TriggerPolicy | None = None) -> TriggerPolicy:
        """Apply `EROICA_POLICY_<FIELD>=value` overrides (used by launchers and tests)."""
        data = (base or cls()).model_dump()
        for name, field in cls.model_fields.items():
            raw = os.environ.get(f"EROICA_POLICY_{name.upper()}")
            if raw is None:
                continue
            if field.annotation is bool:
                data[name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif get_origin(field.annotation) is tuple:     # a comma-separated list
                data[name] = tuple(p.strip() for p in raw.split(",") if p.strip())
            else:
                data[name] = raw
        try:
            return cls.model_validate(data)
        except ValidationError as exc:        # name the variable that set it, not the field alone
            loc = exc.errors()[0]["loc"]
            var = f"EROICA_POLICY_{str(loc[0]).upper()}" if loc else ""
            if var and var in os.environ:
                raise ValueError(f"{var}={os.environ[var]!r}: {exc.errors()[0]['msg']}") from exc
            raise ValueError(first_error(exc)) from exc

    @classmethod
    def unknown_env(cls) -> list[str]:
        """`EROICA_POLICY_*` variables that name no field (a misspelling is otherwise silently ignored), each
        with the closest field's variable."""
        import difflib

        known = {f"EROICA_POLICY_{n.upper()}" for n in cls.model_fields}
        out = []
        for var in sorted(v for v in os.environ if v.startswith("EROICA_POLICY_") and v not in known):
            close = difflib.get_close_matches(var, sorted(known), n=1)
            out.append(f"{var} is not a policy field" + (f" (did you mean {close[0]}?)" if close else ""))
        return out
