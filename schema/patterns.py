"""Typed facts the collector writes: the `eroica.patterns/v1` document and its parts.

Every model is frozen and forbids unknown keys. Units are in field names (`_seconds`,
`_bytes`, `_ratio` in 0..1, `_per_second`, `_total`). Missing data is a `CollectorGap`,
never a silent None.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

PATTERNS_SCHEMA: Final = "eroica.patterns/v1"
# the ids the collector writes (`w<index>-s<start step>`): checked wherever a document is read, so an
# id is never a path, and the bounds every store can hold (a step or rank fits a 32-bit column)
WINDOW_ID_PATTERN: Final = r"^w[0-9]{1,9}-s[0-9]{1,10}$"
MAX_STEP: Final = 2**31 - 1
MAX_WORLD_SIZE: Final = 1_000_000        # ten times the largest jobs run today


class Frozen(BaseModel):
    # NaN and infinity are not measurements: a document carrying one is rejected, naming the field
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Category(str, Enum):
    """What a function execution is, in critical-path priority order (highest first).

    On a device: kernel > memory > communication > CPU-side work. On the CPU-only path the
    host thread is the critical path; semantic wrappers that the collector owns (data loading,
    GC pauses) claim the ops nested inside them, compute ops come next, then communication the
    main thread waits on, then user regions' own time, then untracked Python.
    """

    kernel = "kernel"
    memory = "memory"
    data = "data"
    gc = "gc"
    compute = "compute"
    communication = "communication"
    region = "region"
    python = "python"


#: Lower number = higher priority on the critical path.
CATEGORY_PRIORITY: dict[Category, int] = {c: i for i, c in enumerate(Category)}


class MetricName(str, Enum):
    """The hardware metric that matters for a function while it runs."""

    cpu_util_ratio = "cpu_util_ratio"            # main thread on-CPU time / wall time
    runqueue_wait_ratio = "runqueue_wait_ratio"  # main thread waiting for a CPU / wall time
    nic_bytes_per_second = "nic_bytes_per_second"
    gpu_sm_clock_mhz = "gpu_sm_clock_mhz"


class FunctionPattern(Frozen):
    """The behaviour pattern of one function on one rank in one window (beta, mu, sigma)."""

    category: Category
    name: str
    occurrences_total: NonNegativeInt
    total_seconds: NonNegativeFloat          # inclusive wall time of all executions
    critical_seconds: NonNegativeFloat       # time this function held the critical path
    beta_ratio: float = Field(ge=0, le=1)    # critical_seconds / window wall time
    mean_seconds: NonNegativeFloat
    p50_seconds: NonNegativeFloat
    p90_seconds: NonNegativeFloat
    max_seconds: NonNegativeFloat
    std_seconds: NonNegativeFloat
    critical_per_step_seconds: list[NonNegativeFloat]  # one value per step of the window
    metric: MetricName | None = None
    metric_mean: float | None = None
    metric_std: float | None = None
    metric_samples_total: NonNegativeInt = 0


class HardwareSummary(Frozen):
    """Whole-window hardware signature of one rank (means over the window)."""

    sample_interval_seconds: NonNegativeFloat
    samples_total: NonNegativeInt
    cpu_util_ratio: float | None = None               # main thread, 1.0 = one full core
    process_cpu_cores: float | None = None            # all threads of the process, in cores
    runqueue_wait_ratio: float | None = None          # main thread runnable but not running
    involuntary_ctx_switches_per_second: float | None = None
    io_wait_ratio: float | None = None               # share of samples with the training thread in D state
    cgroup_throttled_ratio: float | None = None       # throttled time / window time
    cgroup_nr_throttled_total: int | None = None
    cgroup_cpu_quota_cores: float | None = None       # quota / period; None when unlimited
    # CPU of the other processes in the rank's CPU cgroup (its container): loader workers and any
    # co-located process, in cores; compared with the peers, whose workers are alike
    cgroup_others_cpu_cores: float | None = None
    system_cpu_util_ratio: float | None = None        # all cores, 0..1
    per_core_util_ratio: list[float] = Field(default_factory=list)
    rss_bytes: float | None = None
    swap_used_bytes: float | None = None
    cgroup_memory_usage_ratio: float | None = None     # memory cgroup usage / limit (mean over the window)
    cgroup_memory_limit_hits_per_second: float | None = None
    major_faults_per_second: float | None = None
    minor_faults_per_second: float | None = None
    disk_read_bytes_per_second: float | None = None
    disk_write_bytes_per_second: float | None = None
    nic_bytes_per_second: dict[str, float] = Field(default_factory=dict)
    gpu: dict[str, float] = Field(default_factory=dict)
    # the rank's DataLoader worker processes (collector/loader_workers.py); None when it has none.
    # Busy: running, in D state, or asleep outside the loader's own queues (a timer, a socket, a
    # page being read); idle: waiting for its next index. Ratios are shares of the workers' time.
    loader_workers_total: int | None = None
    loader_worker_busy_ratio: float | None = None
    loader_worker_cpu_ratio: float | None = None               # CPU seconds / (workers x window)
    loader_worker_io_wait_ratio: float | None = None           # in D state (waiting for block I/O)
    loader_worker_runqueue_wait_ratio: float | None = None     # runnable, waiting for a CPU
    loader_worker_major_faults_per_second: float | None = None     # all workers together
    loader_worker_disk_read_bytes_per_second: float | None = None  # all workers together
    # where the busy workers slept (kernel function -> share of their busy samples), top few
    loader_worker_blocked_in: dict[str, float] = Field(default_factory=dict)
    # the scalar signals of PER_STEP_SIGNALS again, one value per step of the window (None where a
    # step had too few samples), so the engine can leave a one-off spike step out of the comparison
    per_step: dict[str, list[float | None]] = Field(default_factory=dict)


PER_STEP_SIGNALS = (
    "cgroup_throttled_ratio", "cpu_util_ratio", "runqueue_wait_ratio", "io_wait_ratio",
    "involuntary_ctx_switches_per_second", "major_faults_per_second", "minor_faults_per_second",
    "swap_used_bytes", "cgroup_memory_usage_ratio", "cgroup_memory_limit_hits_per_second",
    "disk_write_bytes_per_second", "disk_read_bytes_per_second", "process_cpu_cores", "system_cpu_util_ratio",
)


class CollectorGap(Frozen):
    """Something the collector could not collect: recorded, never silent."""

    kind: Literal["collector_gap"] = "collector_gap"
    source: str
    reason: str


class CollectorOverhead(Frozen):
    """What the collector itself cost on this rank."""

    detector_seconds_total: NonNegativeFloat       # time inside mon.step() bookkeeping, whole run so far
    detector_calls_total: NonNegativeInt
    sampler_cpu_seconds: NonNegativeFloat          # sampler thread CPU during the window
    summarize_seconds: NonNegativeFloat            # wall time to build this document
    raw_events_total: NonNegativeInt               # function executions seen in the window
    raw_events_dropped_total: NonNegativeInt       # over the event buffer cap
    raw_trace_bytes: NonNegativeInt = 0            # bounded escape-hatch trace, when kept
    pattern_bytes: NonNegativeInt = 0              # size of this document (filled at write time)


class ProcessGroupInfo(Frozen):
    """One process group this rank belongs to (not the world): its description, size, and this
    rank's position in it. A pipeline stage or an expert shard is a position in such a group."""

    desc: str
    size: int = Field(ge=1)
    index: NonNegativeInt


class JobInfo(Frozen):
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    local_rank: int = Field(0, ge=0, lt=MAX_WORLD_SIZE)
    hostname: str = Field(min_length=1, max_length=255)
    pid: int = Field(ge=0, le=2**31 - 1)
    role: str = "worker"
    backend: str = "unknown"
    device: str = "cpu"
    process_groups: list[ProcessGroupInfo] = Field(default_factory=list)  # read when the window closes


class WindowInfo(Frozen):
    window_id: str = Field(pattern=WINDOW_ID_PATTERN)
    start_step: int = Field(ge=0, le=MAX_STEP)
    end_step: int = Field(ge=0, le=MAX_STEP)        # exclusive
    trigger: Literal["detector", "forced", "requested"]
    triggered_by_rank: int | None = None
    wall_seconds: NonNegativeFloat
    # this rank's wall clock (unix seconds) when the window opened and closed: how fast the service
    # diagnosed it is measured from the last rank's close (clocks differ by milliseconds, not steps)
    opened_unix_seconds: float | None = None
    closed_unix_seconds: float | None = None


class StepTimes(Frozen):
    before_seconds: list[NonNegativeFloat]          # recent steps before the window (the baseline)
    during_seconds: list[NonNegativeFloat]          # the window's steps
    baseline_median_seconds: float | None = None


class ConfigFact(Frozen):
    key: str
    value: str
    # the step from which the rank ran with this value: 0 from the job's first step; a later step when
    # the collector saw it change (read at its first step, every CONFIG_EVERY_STEPS steps and at each
    # window's opening: a change is dated at most that late). None: not recorded (an older collector)
    since_step: NonNegativeInt | None = None


class PatternsDoc(Frozen):
    """One rank's local summary of one profiling window."""

    schema_: Literal["eroica.patterns/v1"] = Field(PATTERNS_SCHEMA, alias="schema")
    job: JobInfo
    window: WindowInfo
    step_times: StepTimes
    functions: list[FunctionPattern]
    hardware: HardwareSummary
    config: list[ConfigFact] = Field(default_factory=list)
    gaps: list[CollectorGap] = Field(default_factory=list)
    overhead: CollectorOverhead
    # a light window's structural evidence (the profiler's per-node functions carry it otherwise): the
    # autograd nodes its steps' backward passes ran, by type; {} when not counted
    autograd_nodes_total: dict[str, NonNegativeInt] = Field(default_factory=dict)
    # the window steps those counts cover: a light window stops counting once SAME_STEPS steps in a row
    # ran the same nodes (a static graph); None: every step of the window
    autograd_nodes_steps: NonNegativeInt | None = None
    privacy: Literal["keep", "hash", "drop"] = "keep"   # what was done to names before writing

    model_config = ConfigDict(populate_by_name=True)    # and Frozen's, which pydantic merges in
