"""Typed facts the engine derives from peer comparison; only deviating ones reach the rule engine.

Cross-rank numbers are ratios to the peer-group median (a named reference), never averages of
averages. Units are in field names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

from eroica.schema.hang import State


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def one_of(domain: str, default: Any = ...) -> Any:
    """A string field whose values come from a closed set the rule vocabulary names
    (eroica.engine.rules.vocabulary: `category`, `signal`, `metric`, `gap_source`): a rule comparing it
    with a value outside the set can never fire, and `eroica rules lint` says so."""
    return Field(default, json_schema_extra={"domain": domain})


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    #: where the engine states it: in a window's diagnosis, or in a hang's (a rule matches one or the other)
    context: ClassVar[Literal["window", "hang"]] = "window"
    rank: NonNegativeInt

    def evidence(self) -> str | None:
        """The line a finding resting on this fact shows as evidence (None: it adds none of its own)."""
        return None


class RankSlowness(Fact):
    """A rank that is busy (not waiting on its peers) longer than its peers, per step."""

    kind: Literal["rank_slowness"] = "rank_slowness"
    group: str
    busy_seconds_per_step: NonNegativeFloat
    peer_median_busy_seconds_per_step: NonNegativeFloat
    excess_seconds_per_step: float
    excess_step_ratio: float = Field(ge=0, le=1)   # excess / peer-median step time: what the rank costs the job
    busy_ratio_to_median: NonNegativeFloat
    comm_wait_ratio_to_median: NonNegativeFloat   # culprits wait least; victims wait most
    least_waiting: bool                      # this rank waits least of its group in communication
    robust_z: float
    consistency_ratio: float = Field(ge=0, le=1)  # share of window steps in which it was slow
    peers: NonNegativeInt
    group_valid: bool

    def evidence(self) -> str:
        return (f"rank {self.rank} is busy {_ms(self.busy_seconds_per_step)}/step against a peer median of "
                f"{_ms(self.peer_median_busy_seconds_per_step)} (+{self.excess_step_ratio:.0%} of a step); it waits "
                f"{self.comm_wait_ratio_to_median:.2f}x the peers' communication time"
                + (": the others wait for it" if self.least_waiting else ""))


class FunctionOutlier(Fact):
    """One function on one rank holds the critical path longer than on its peers."""

    kind: Literal["function_outlier"] = "function_outlier"
    category: str = one_of("category")
    function: str
    seconds_per_step: NonNegativeFloat
    peer_median_seconds_per_step: NonNegativeFloat
    excess_seconds_per_step: float
    ratio_to_median: float = Field(ge=0, le=1000)   # capped at 1000 when the peers' median is 0
    explains_ratio: float = Field(ge=0, le=1)  # share of the rank's excess busy time it explains
    robust_z: float
    metric: str | None = one_of("metric", None)
    metric_mean: float | None = None
    peer_metric_median: float | None = None
    metric_ratio_to_median: float | None = None  # None when the metric is missing here or at peers
    occurrences_total: NonNegativeInt = 0
    peer_median_occurrences: float = 0.0

    def evidence(self) -> str:
        return (f"{self.function}: {_ms(self.seconds_per_step)}/step vs {_ms(self.peer_median_seconds_per_step)} "
                f"(x{self.ratio_to_median:.1f}), explains {self.explains_ratio:.0%}")


class CategoryExcess(Fact):
    """All functions of one category on one rank, beside the peers: where the excess time went."""

    kind: Literal["category_excess"] = "category_excess"
    category: str = one_of("category")
    seconds_per_step: NonNegativeFloat
    peer_median_seconds_per_step: NonNegativeFloat
    excess_seconds_per_step: float
    explains_ratio: float = Field(ge=0, le=1)
    top_function: str
    metric_ratio_to_median: float | None = None   # critical-time-weighted metric vs peers
    # seconds_per_step over the peers' (at most 1000; 1000 when theirs is 0 and this rank's is not): how
    # far the rank's time in the category stands out from what its peers spend there anyway
    ratio_to_median: float = Field(1.0, ge=0, le=1000)

    def evidence(self) -> str:
        mr = self.metric_ratio_to_median
        return (f"{self.category} holds the critical path {_ms(self.seconds_per_step)}/step vs "
                f"{_ms(self.peer_median_seconds_per_step)} on peers, explaining {self.explains_ratio:.0%} of the "
                f"excess (top: {self.top_function})" + (f"; CPU rate {mr:.2f}x the peers'" if mr is not None else ""))


class HardwareSignal(Fact):
    """One whole-window hardware signal of a suspect rank, beside its peers' median."""

    kind: Literal["hw_signal"] = "hw_signal"
    signal: str = one_of("signal")
    value: float
    peer_median: float
    delta: float                             # value - peer_median
    ratio_to_median: float = Field(le=1000)  # capped at 1000 when the median is 0

    def evidence(self) -> str:
        return f"{self.signal} = {self.value:.3g} (peer median {self.peer_median:.3g})"


class LinkSignature(Fact):
    """A rank whose link runs steadier (lower rate spread / mean) than its peers' during communication."""

    kind: Literal["link_signature"] = "link_signature"
    function: str
    mean_bytes_per_second: NonNegativeFloat
    cv_ratio: NonNegativeFloat               # sigma / mu of the link's byte rate while communicating
    peer_median_cv_ratio: NonNegativeFloat
    cv_ratio_to_median: NonNegativeFloat
    rate_ratio_to_median: NonNegativeFloat
    comm_share_ratio: float = Field(ge=0, le=1)   # the group's median share of the window in communication
    excess_step_ratio: float                 # what the finding costs the job (here: the communication share)
    steadiest: bool
    comm_wait_ratio_to_median: float         # ~1 for a capped link (everyone waits), << 1 for a late rank
    # absolute evidence: the link's own peak rate (mean + 2 sigma) against the peak its peers reach
    # during the same collectives; a capped link never gets near it, a merely steady one does
    peak_bytes_per_second: float = 0.0
    peer_median_peak_bytes_per_second: float = 0.0
    peak_ratio_to_peers: float = 1.0

    def evidence(self) -> str:
        return (f"link byte rate during {self.function}: mean {self.mean_bytes_per_second:.3g} B/s, spread "
                f"{self.cv_ratio:.2f} of the mean vs {self.peer_median_cv_ratio:.2f} on peers (steady = capped); "
                f"it waits {self.comm_wait_ratio_to_median:.2f}x the peers' communication time (not a late rank)")


class ConfigDeviation(Fact):
    """A configuration value on one rank that differs from the majority of its peers. `since_step`: the
    step from which the rank and its peers held these values (the collector's dating: 0 from the job's
    start, else the reading that first saw it); `seen_while_healthy`: the job ran clearly faster than now
    with it, in the first steps after it began (`healthy_from_step`..`healthy_to_step`, at
    `healthy_step_seconds`) or in an earlier window (`seen_in_window`)."""

    kind: Literal["config_deviation"] = "config_deviation"
    key: str
    value: str
    peer_value: str
    # the job's history: an earlier window of the run, when the job was clearly faster, showed the same
    # difference on this rank; a difference that was there when the job was healthy cannot explain a slowdown
    seen_while_healthy: bool = False
    seen_in_window: str | None = None
    # when the difference began (the later of the rank's and its peers' since-steps; None: not dated), and
    # the stretch of the job's always-on step series where the job ran clearly faster than now with it
    since_step: NonNegativeInt | None = None
    healthy_from_step: NonNegativeInt | None = None
    healthy_to_step: NonNegativeInt | None = None
    healthy_step_seconds: NonNegativeFloat | None = None

    def evidence(self) -> str:
        since = "" if self.since_step is None else (" from the job's start" if self.since_step == 0
                                                     else f" since step {self.since_step} at the latest")
        return f"{self.key} = {self.value} on rank {self.rank}, {self.peer_value} on its peers{since and ','}{since}"

    def while_healthy(self) -> str:
        """Where the job ran healthy with this difference, in words ("" when it did not)."""
        if self.healthy_step_seconds is not None:
            return (f"the job ran at {self.healthy_step_seconds * 1e3:.0f} ms a step with it "
                    f"(steps {self.healthy_from_step}-{self.healthy_to_step})")
        return f"window {self.seen_in_window} showed it while the job was faster" if self.seen_in_window else ""


class StepSpike(Fact):
    """One step of the window that took many times the usual step time, and the rank that held it up.

    Such a step is left out of the peer comparison (one 9 s stall would otherwise swamp ten steps of a
    sustained fault and make the rank it hit look like the culprit of the whole window); it is
    reported on its own."""

    kind: Literal["step_spike"] = "step_spike"
    step_number: NonNegativeInt
    step_seconds: NonNegativeFloat           # the job's step time in that step (median over ranks)
    median_step_seconds: NonNegativeFloat    # the job's median step time over the window's other steps
    ratio_to_median: NonNegativeFloat
    busy_seconds: NonNegativeFloat           # this rank's busy (non-waiting) time in that step
    peer_median_busy_seconds: NonNegativeFloat
    busy_share_ratio: float = Field(ge=0, le=1)   # busy_seconds / step_seconds: 1 = it held the step up alone
    category: str | None = one_of("category", None)   # what held this rank's critical path in that step
    function: str | None = None
    function_seconds: float = 0.0
    excess_step_ratio: float                 # the spike's extra time / the window's total step time
    consistency_ratio: float = Field(ge=0, le=1)  # share of the window's steps it hit (1 of n)
    # this rank's thread during that step, when the collector kept signals per step
    io_wait_ratio: float | None = Field(None, ge=0, le=1)   # in uninterruptible (D) sleep: storage, page cache, reclaim
    runqueue_wait_ratio: float | None = Field(None, ge=0, le=1)  # runnable, waiting for a CPU
    cpu_util_ratio: float | None = Field(None, ge=0, le=1)      # on a CPU

    def evidence(self) -> str:
        sig = [f"{n.split('_ratio')[0].replace('_', ' ')} {v:.0%}" for n, v in
               (("io_wait_ratio", self.io_wait_ratio), ("runqueue_wait_ratio", self.runqueue_wait_ratio),
                ("cpu_util_ratio", self.cpu_util_ratio)) if v is not None]
        return (f"step {self.step_number}: {self.step_seconds:.2f} s against a median of "
                f"{_ms(self.median_step_seconds)}; rank {self.rank} busy {self.busy_seconds:.2f} s of it (peers "
                f"{_ms(self.peer_median_busy_seconds)}), {self.function_seconds:.2f} s in {self.function}"
                + (f"; its thread in that step: {', '.join(sig)}" if sig else ""))


class HostCpuLoad(Fact):
    """The CPU load of a suspect rank's host, split into the job's own processes and everything else.

    The training processes' CPU (all their threads) is subtracted from the host's busy cores: what
    is left is other processes (data-loader workers, the collector's sampler, and any co-located
    service). Only the ranks that reported are counted as the job's."""

    kind: Literal["host_cpu"] = "host_cpu"
    host: str
    cores_total: NonNegativeInt
    busy_cores: NonNegativeFloat
    job_cores: NonNegativeFloat              # the reporting ranks on this host, all their threads
    other_cores: NonNegativeFloat            # busy_cores - job_cores (not below 0)
    busy_ratio: float = Field(ge=0, le=1)    # busy_cores / cores_total
    ranks_on_host: NonNegativeInt

    def evidence(self) -> str:
        return (f"host {self.host}: {self.busy_cores:.2f} of {self.cores_total} cores busy, the job's "
                f"{self.ranks_on_host} rank(s) use {self.job_cores:.2f}, other processes {self.other_cores:.2f}")


class JobSlowdown(Fact):
    """The whole job's step time in the window against its baseline, stated on the rank that waits
    for a CPU most (a host-wide cause slows every rank; the busy-time comparison then finds no
    straggler, and this fact carries the cost)."""

    kind: Literal["job_slowdown"] = "job_slowdown"
    step_seconds: NonNegativeFloat           # median step over the window's kept steps and ranks
    baseline_step_seconds: NonNegativeFloat  # the detector's reference before the window
    step_ratio_to_baseline: NonNegativeFloat
    excess_step_ratio: float = Field(ge=0, le=1)   # (step - baseline) / step: the share of each step lost
    ranks_standing_out: NonNegativeInt       # ranks with a rank_slowness fact in the group

    def evidence(self) -> str:
        return (f"the job's step: {_ms(self.step_seconds)} against {_ms(self.baseline_step_seconds)} before the "
                f"window (x{self.step_ratio_to_baseline:.2f}); {self.ranks_standing_out} rank(s) stand out in "
                "busy time")


class StepShare(Fact):
    """The share of a rank's step one category holds on the critical path, stated only where no valid
    peer group exists: expected-range rules judge it against what a healthy step looks like."""

    kind: Literal["step_share"] = "step_share"
    category: str = one_of("category")
    share_ratio: float = Field(ge=0, le=1)   # critical seconds of the category / step seconds
    seconds_per_step: NonNegativeFloat
    top_function: str
    group_valid: bool

    def evidence(self) -> str:
        return (f"{self.category} holds {self.share_ratio:.0%} of rank {self.rank}'s step "
                f"({_ms(self.seconds_per_step)}/step, top: {self.top_function})")


class DeviceIdle(Fact):
    """On a device (GPU) rank: how long per step its device sat idle while host-side work held the
    critical path (launches, CPU ops, Python), against its peers. A rank whose host is slow to
    launch work leaves its device idle between kernels while the peers wait for it in collectives."""

    kind: Literal["device_idle"] = "device_idle"
    seconds_per_step: NonNegativeFloat       # host work on the critical path while the device idled
    peer_median_seconds_per_step: NonNegativeFloat
    excess_seconds_per_step: float
    explains_ratio: float = Field(ge=0, le=1)   # share of the rank's excess busy time it explains
    idle_ratio_of_step: float = Field(ge=0, le=1)
    top_category: str = one_of("category")   # the host-side category that grew most (compute, python, data...)
    top_function: str

    def evidence(self) -> str:
        return (f"its device idles {_ms(self.seconds_per_step)}/step while host work holds the critical path "
                f"(peers {_ms(self.peer_median_seconds_per_step)}; {self.top_category}: {self.top_function})")


class EvidenceGap(Fact):
    """What a suspect rank's collector could not collect (a source and why): a rule that needs that
    evidence lowers its confidence or stands down (`emit.needs`), and a rule may match it directly."""

    kind: Literal["evidence_gap"] = "evidence_gap"
    source: str = one_of("gap_source")       # the collector source: nvml, hardware, sampler, cgroup_quota...
    reason: str

    def evidence(self) -> str:
        return f"{self.source} evidence missing on rank {self.rank}: {self.reason}"


class HangState(Fact):
    """Where one rank stands in a hang, beside its peers (eroica.engine.hang): `state` is one of
    waiting_in_collective, before_collective (it never reached the collective most ranks wait in),
    different_collective (it ran ahead, or stands in another collective or shape), dead (its process
    is gone), gone (no snapshot, and its heartbeat stopped while the others' kept coming: died or cut
    off, seen across hosts), dropped (no snapshot, and a rank on another host lost its connection to
    this rank's host), silent (no snapshot), link_down, errored (its collective failed)."""

    kind: Literal["hang_state"] = "hang_state"
    context: ClassVar[Literal["window", "hang"]] = "hang"
    state: State
    seq: int = -1                            # the default group's collective sequence number (-1: unknown)
    in_data_loader: bool = False             # its stack is inside a DataLoader
    waits_on_lock: bool = False              # its innermost user line takes a lock
    function: str = ""                       # its innermost frame in the user's code
    file: str = ""
    line: int = 0
    code: str = ""
    collective: str = ""                     # what it stands in
    detail: str = ""

    def evidence(self) -> str:
        where = f" at {self.function} ({self.file}:{self.line})" if self.function else ""
        return f"rank {self.rank}: {self.state.replace('_', ' ')}{where}" + (f"; {self.detail}" if self.detail else "")


FACT_TYPES: dict[str, type[Fact]] = {
    "rank_slowness": RankSlowness,
    "function_outlier": FunctionOutlier,
    "category_excess": CategoryExcess,
    "hw_signal": HardwareSignal,
    "config_deviation": ConfigDeviation,
    "link_signature": LinkSignature,
    "step_spike": StepSpike,
    "host_cpu": HostCpuLoad,
    "job_slowdown": JobSlowdown,
    "step_share": StepShare,
    "device_idle": DeviceIdle,
    "evidence_gap": EvidenceGap,
    "hang_state": HangState,
}
