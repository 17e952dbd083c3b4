"""What the API accepts, typed and bounded: a step summary, an issue's transition and a rank's hang
snapshot. Every number fits the columns it is stored in (a step or rank in 32 bits), every string
has a length, and a hang snapshot's parts are typed down to the fields the engine reads, so a
well-formed but hostile document is a 422 naming its field, never a 500 (which the sink would retry
and spool forever)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eroica.collector.facts import MAX_STEP, MAX_WORLD_SIZE
from eroica.service.errors import IngestError

MAX_INT = 2**31 - 1
Step = Field(ge=0, le=MAX_STEP)


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StepSummaryIn(In):
    """One summary of the job's always-on step-time series (rank 0 sends one every N steps)."""

    first_step: int = Step
    last_step: int = Step
    median_seconds: float = Field(gt=0, lt=86400)
    p90_seconds: float = Field(gt=0, lt=86400)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)

    @model_validator(mode="after")
    def _ordered(self) -> StepSummaryIn:
        if self.last_step < self.first_step:
            raise ValueError(f"last_step {self.last_step} is before first_step {self.first_step}")
        return self


class TransitionIn(In):
    who: str = Field(min_length=1, max_length=200)
    why: str | None = Field(None, max_length=4000)
    url: str | None = Field(None, max_length=2000)
    kind: str | None = Field(None, max_length=32)


# ---------------------------------------------------------------- the hang snapshot (eroica.hang/v1)
class _Part(BaseModel):
    # the collector may add fields to a part; those the engine reads are typed, the rest are dropped
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class Frame(_Part):
    file: str = Field(max_length=4096)
    line: int = Field(ge=0, le=MAX_INT)
    function: str = Field(max_length=1024)
    code: str = Field("", max_length=1024)


class CollectiveCall(_Part):
    """The last collective a rank entered or completed through torch.distributed's Python API."""

    op: str = Field(max_length=128)
    seq: int | None = Field(None, ge=0, le=2**62)
    shape: list[int] | None = Field(None, max_length=64)
    dtype: str | None = Field(None, max_length=64)
    file: str = Field(max_length=4096)
    line: int = Field(ge=0, le=MAX_INT)
    function: str = Field(max_length=1024)
    wall_time: float | None = None


class FlightRecord(_Part):
    """One entry of torch's Flight Recorder, as the collector keeps it."""

    seq: int | None = Field(None, ge=0, le=2**62)
    op: str | None = Field(None, max_length=128)
    sizes: list[list[int]] | None = Field(None, max_length=64)
    state: str | None = Field(None, max_length=64)
    pg: str | int | None = None


class Nic(_Part):
    operstate: str = Field("unknown", max_length=16)
    rx_bytes_per_second: float | None = None
    tx_bytes_per_second: float | None = None


class PeerView(_Part):
    step: int | None = Field(None, ge=0, le=MAX_STEP)
    heartbeat: None = None
    heartbeat_age_seconds: float | None = None
    host: str | None = Field(None, max_length=255)
    pid: int | None = Field(None, ge=0, le=MAX_INT)
    process_alive: bool | None = None
    error: str | None = Field(None, max_length=1000)


class HangSnapshotIn(_Part):
    """One rank's snapshot, as its watchdog writes it (eroica.collector.hang)."""

    schema_: Literal["eroica.hang/v1"] = Field(alias="schema")
    job: str = Field("", max_length=256)
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    host: str | None = Field(None, max_length=255)
    pid: int | None = Field(None, ge=0, le=MAX_INT)
    wall_time: float = Field(ge=0, lt=1e11)
    last_step: int = Step
    stalled_seconds: float = Field(ge=0, lt=1e9)
    limit_seconds: float = Field(ge=0, lt=1e9)
    median_step_seconds: float | None = Field(None, ge=0, lt=1e9)
    error: str | None = Field(None, max_length=4000)
    stack: list[Frame] = Field(max_length=200)
    stack_gap: str | None = Field(None, max_length=1000)
    seq: int | None = Field(None, ge=0, le=2**62)
    last_entered: CollectiveCall | None = None
    last_completed: CollectiveCall | None = None
    flight_recorder: list[FlightRecord] | None = Field(None, max_length=64)
    process_cpu_ratio: float | None = None
    nics: dict[str, Nic] = Field(default_factory=dict, max_length=256)
    peers: dict[str, PeerView] = Field(default_factory=dict, max_length=4096)
    peers_wall_time: float | None = None

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _rank_in_world(self) -> HangSnapshotIn:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..world_size-1 ({self.world_size})")
        return self


def refusal(exc: ValidationError) -> IngestError:
    """A pydantic error as the service's 422: the first problem, naming its field."""
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "body"
    if err["type"] == "json_invalid":
        return IngestError(400, f"not JSON: {err['msg']}", "body")
    return IngestError(422, err["msg"], where)


def parse_hang(body: bytes) -> HangSnapshotIn:
    try:
        return HangSnapshotIn.model_validate_json(body)
    except ValidationError as exc:
        raise refusal(exc) from exc
