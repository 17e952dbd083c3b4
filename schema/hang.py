"""The hang documents: a rank's watchdog snapshot (`eroica.hang/v1`, what eroica.collector.hang
writes and the service accepts) and the engine's verdict on a hang (`HangFinding`).

The snapshot is typed down to the fields the engine reads and bounded (every string has a length,
every number fits its column); fields the collector adds later are dropped, not refused.
A native dump (`hang-native/rank-<R>.txt`) starts with a JSON header padded to NATIVE_HEADER bytes,
then faulthandler's text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, StringConstraints, model_validator

from eroica.schema.patterns import MAX_STEP, MAX_WORLD_SIZE

HANG_SCHEMA: Final = "eroica.hang/v1"
#: a rank's stall as its watchdog judged it (eroica.collector.hang_clock); a snapshot that does not say
#: was written at the confirmed limit (the only one there was)
HangStage = Literal["suspected", "confirmed", "resolved"]
NATIVE_HEADER: Final = 512                 # bytes of JSON header before faulthandler's text
# a peer's heartbeat (every 2 s from a living rank's watchdog) this old says the rank is gone: the
# engine states it so, and a watchdog sends its view of the peers again when one crosses it
GONE_SECONDS: Final = 15.0
MAX_INT = 2**31 - 1
Step = Field(ge=0, le=MAX_STEP)


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
    seq: int | None = Field(None, ge=0, le=2**62)     # its default group's collective sequence number
    heartbeat: None = None
    heartbeat_age_seconds: float | None = None
    host: str | None = Field(None, max_length=255)
    pid: int | None = Field(None, ge=0, le=MAX_INT)
    process_alive: bool | None = None
    error: str | None = Field(None, max_length=1000)
    addrs: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=16)   # its host's


class HangSnapshot(_Part):
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
    limit_seconds: float = Field(ge=0, lt=1e9)                 # the confirmed hang's limit
    median_step_seconds: float | None = Field(None, ge=0, lt=1e9)
    state: HangStage = "confirmed"
    suspected_because: str | None = Field(None, max_length=1000)  # the stall's length, or the peers' collectives
    suspect_after_seconds: float | None = Field(None, ge=0, lt=1e9)
    # the job's longest healthy pause this rank saw (its longest step so far) and the step it ended
    longest_pause_seconds: float | None = Field(None, ge=0, lt=1e9)
    longest_pause_step: int | None = Field(None, ge=0, le=MAX_STEP)
    steps_seen: int | None = Field(None, ge=0, le=MAX_STEP)
    # resolved: the rank stepped again, at this time, after a stall of this long
    resolved_wall_time: float | None = Field(None, ge=0, lt=1e11)
    resolved_after_seconds: float | None = Field(None, ge=0, lt=1e9)
    resumed_step: int | None = Field(None, ge=0, le=MAX_STEP)
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
    # a rank that ran no Python (its training thread held the GIL in C code) has no snapshot of its own:
    # a peer on its host read it with py-spy and wrote this one for it (eroica.collector.native_stack)
    native: bool = False
    faulthandler: bool = False              # read from faulthandler's dump (the dead man's switch fired)
    read_by_rank: int | None = Field(None, ge=0, lt=MAX_WORLD_SIZE)
    owns_gil: bool | None = None
    native_frames: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)
    native_gap: str | None = Field(None, max_length=1000)

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _rank_in_world(self) -> HangSnapshot:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..world_size-1 ({self.world_size})")
        return self


# ---------------------------------------------------------------- the verdict
class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HangFrame(Frozen):
    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        return f"{self.function} ({Path(self.file).name}:{self.line}){f': {self.code}' if self.code else ''}"


State = Literal["waiting_in_collective", "before_collective", "different_collective", "dead", "gone", "dropped",
                "silent", "link_down", "errored"]


class HangRankState(Frozen):
    rank: NonNegativeInt
    state: State
    last_step: int | None = None
    seq: int | None = None
    collective: str | None = None            # what it stands in: "all_reduce [1] at x.py:12" or "backward"
    where: HangFrame | None = None           # its innermost frame in the user's code
    in_data_loader: bool = False
    waits_on_lock: bool = False
    detail: str = ""
    host: str | None = None                  # where it ran, as it or its peers' view of the store said
    # a rank that held the GIL in C code: its main thread's frames as py-spy read them from a peer on
    # its host (`hang-native/rank-<R>.pyspy.txt`), innermost first, C and Python alike
    native_frames: list[str] = Field(default_factory=list)


#: a root cause of the taxonomy (knowledge/taxonomy.yaml: the shipped hang causes, or a site's own)
Cause = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Category = Literal["software", "hardware"]


class HangFinding(Frozen):
    root_cause: Cause
    category: Category
    ranks: list[NonNegativeInt]
    where: HangFrame | None
    # prior_confidence (the deciding rule's, or the taxonomy's fallback) x pause_factor
    confidence: float = Field(ge=0, le=1)
    summary: str
    evidence: list[str]
    stalled_seconds: float
    limit_seconds: float                               # the confirmed hang's limit
    states: list[HangRankState]
    hosts: list[str] = Field(default_factory=list)     # the culprits' hosts
    state: HangStage = "confirmed"
    rule_id: str | None = None                         # the rule that decided (None: the taxonomy's fallback)
    prior_confidence: float = Field(1.0, ge=0, le=1)
    # how far the stall exceeds the job's longest healthy pause (eroica.engine.hang.pause_factor); 1 once confirmed
    pause_factor: float = Field(1.0, ge=0, le=1)
    suspect_after_seconds: float | None = None
    longest_pause_seconds: float | None = None         # the job's longest healthy pause before the stall
    longest_pause_step: int | None = None
    resolved_after_seconds: float | None = None        # resolved: how long the stall lasted
    last_step: int | None = None                       # the step the ranks stand at (the slowest's)
    stalled_since: float | None = None                 # the wall time of that step: the stall's beginning
    suspected_because: str | None = None               # the first suspicion's reason (the stall, or the peers)

