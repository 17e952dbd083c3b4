"""Runtime control of a running job's collectors, without restarting it.

An SRE disables or re-enables detection, changes the trigger policy, or asks for a window now:

- `eroica control RUN_DIR ...` appends a request line to `RUN_DIR/control.jsonl` (who, when,
  what); rank 0 watches that file (one `stat` every `control_poll_steps`) and publishes each new
  request through the job's torch.distributed store; or
- `eroica control RUN_DIR --store HOST:PORT ...` publishes it to the job's store directly (a job
  without a shared filesystem).

Every rank reads the store's change counter (one round trip every `control_poll_steps`) and applies
each change at the same *step number*, the publisher's step plus `control_lead_steps`, so the ranks
never disagree on whether a window opens or how long it is. Rank 0 logs every change it applied or
rejected, with who asked and when, in `RUN_DIR/control.log.jsonl`.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eroica.collector.policy import TriggerPolicy, first_error

PREFIX = "eroica/control/"
SEQ_KEY = PREFIX + "seq"
STEP_KEY = PREFIX + "step"           # rank 0's latest step and the lead, "step:lead"
REQUESTS_FILE = "control.jsonl"
LOG_FILE = "control.log.jsonl"
MAX_LINE_BYTES = 64 * 1024


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ControlRequest(BaseModel):
    """One change an operator asks for (a line of control.jsonl)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    who: str = Field(min_length=1, description="who asks (a name, a ticket)")
    at: str = Field(default_factory=now_iso, description="when they asked (ISO 8601)")
    enable: bool | None = Field(None, description="turn the detector on (true) or off (false)")
    policy: dict[str, Any] = Field(default_factory=dict, description="trigger-policy fields to change")
    window_now: bool = Field(False, description="open a profiling window on every rank now")
    note: str = ""


class ControlChange(BaseModel):
    """A request as published through the store: numbered, with the step every rank applies it at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=1)
    effective_step: int = Field(ge=0)
    request: ControlRequest


def body_key(seq: int) -> str:
    return f"{PREFIX}{seq}"


def publish(store: Any, request: ControlRequest, effective_step: int) -> ControlChange:
    """Number the request and put it in the store (the counter first: a reader that sees the new
    number before the body retries at its next poll)."""
    seq = int(store.add(SEQ_KEY, 1))
    change = ControlChange(seq=seq, effective_step=effective_step, request=request)
    store.set(body_key(seq), change.model_dump_json())
    return change


def published_step(store: Any) -> tuple[int, int] | None:
    """(rank 0's latest step, its control lead), when a Monitor has published them."""
    if not store.check([STEP_KEY]):
        return None
    raw = store.get(STEP_KEY)
    step, lead = (raw.decode() if isinstance(raw, bytes) else raw).split(":")
    return int(step), int(lead)


class ControlReader:
    """A rank's view of the published changes: the ones not yet seen, in order."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.seen = 0

    def poll(self) -> list[ControlChange]:
        last = int(self.store.add(SEQ_KEY, 0))
        out = []
        while self.seen < last:
            key = body_key(self.seen + 1)
            if not self.store.check([key]):
                break           # numbered but not written yet: next poll
            raw = self.store.get(key)
            out.append(ControlChange.model_validate_json(raw))
            self.seen += 1
        return out


class RequestFile:
    """Rank 0's watch on RUN_DIR/control.jsonl: new complete lines since the last look, parsed;
    a line that is not a valid request comes back as (None, reason)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.mtime_ns = -1
        self.line_no = 0

    def new_requests(self) -> list[tuple[ControlRequest | None, str]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if st.st_mtime_ns == self.mtime_ns and st.st_size == self.offset:
            return []
        self.mtime_ns = st.st_mtime_ns
        if st.st_size < self.offset:        # truncated or replaced: read it again from the start
            self.offset, self.line_no = 0, 0
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(MAX_LINE_BYTES * 16)
        end = data.rfind(b"\n") + 1          # complete lines only: a line being written waits
        self.offset += end
        out: list[tuple[ControlRequest | None, str]] = []
        for line in data[:end].splitlines():
            self.line_no += 1
            if not line.strip():
                continue
            where = f"{self.path}:{self.line_no}"
            try:
                out.append((ControlRequest.model_validate_json(line), where))
            except ValidationError as exc:
                out.append((None, f"{where}: {first_error(exc, '(line)')}"))
        return out


def append_request(run_dir: Path, request: ControlRequest) -> Path:
    """What `eroica control` does without --store: one line appended (atomic for lines this short)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / REQUESTS_FILE
    line = request.model_dump_json() + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path


def log_line(run_dir: Path, record: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOG_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"logged_at": now_iso(), "unix_time": round(time.time(), 3), **record}) + "\n")


class ControlAgent:
    """What a Monitor runs for runtime control: rank 0 publishes its step and the requests it finds
    in the control file; every rank collects the published changes and hands them over when due."""

    def __init__(self, store: Any, rank: int, run_dir: Path, lead_steps: int) -> None:
        self.store, self.rank, self.run_dir, self.lead = store, rank, run_dir, lead_steps
        self.reader = ControlReader(store)
        self.requests = RequestFile(run_dir / REQUESTS_FILE) if rank == 0 else None
        self.pending: list[ControlChange] = []

    def poll(self, step: int) -> list[ControlChange]:
        """The store round trips (run off the training thread): rank 0 publishes its step and the new
        requests of the control file; every rank reads the changes published since its last poll."""
        if self.requests is not None:
            self.store.set(STEP_KEY, f"{step}:{self.lead}")
            for req, where in self.requests.new_requests():
                if req is None:
                    log_line(self.run_dir, {"result": f"rejected: {where}", "step": step})
                    continue
                publish(self.store, req, step + self.lead)
        return self.reader.poll()

    def add(self, changes: list[ControlChange]) -> None:
        """Changes the store worker read (poll's answer), to apply when their step comes."""
        self.pending += changes

    def due(self, step: int) -> list[ControlChange]:
        if not self.pending:          # every step: nothing to build when nothing waits
            return []
        now = [c for c in self.pending if c.effective_step <= step]
        self.pending = [c for c in self.pending if c.effective_step > step]
        return sorted(now, key=lambda c: c.seq)

    def record(self, change: ControlChange, step: int, result: str) -> None:
        """Rank 0 logs each change once, as it applied it (every rank applies it at the same step)."""
        if self.rank == 0:
            log_line(self.run_dir, {"seq": change.seq, "who": change.request.who, "at": change.request.at,
                                    "effective_step": change.effective_step, "step": step, "result": result,
                                    "request": change.request.model_dump(exclude_defaults=True)})


def apply_change(policy: TriggerPolicy, change: ControlChange) -> tuple[TriggerPolicy, str]:
    """The policy after `change`, and what happened ("applied", or "rejected: field ...: why"): a
    change that does not validate leaves the policy as it was."""
    fields = dict(change.request.policy)
    if change.request.enable is not None:
        fields["enabled"] = change.request.enable
    if not fields:
        return policy, "applied"
    try:
        return TriggerPolicy.model_validate({**policy.model_dump(), **fields}), "applied"
    except ValidationError as exc:
        return policy, f"rejected: {first_error(exc)}"
