"""One profiling window's lifecycle on one rank: open the recorders at the agreed step, keep the
step boundaries and the bounded event buffer while it is open, close them and hand back the
window's record. When windows open is the Monitor's business; where records go is the output's."""

from __future__ import annotations

import time
from collections import deque

from eroica.collector.critical import Execution
from eroica.collector.hooks.gc_hook import GcHook
from eroica.collector.host_sampler import HostSamplerClient
from eroica.collector.policy import TriggerPolicy
from eroica.collector.sampler_proc import SamplerClient
from eroica.collector.sites import remember_site
from eroica.collector.stack_sampler import StackSampler
from eroica.collector.summarize import WindowRecord
from eroica.collector.sync import WindowPlan
from eroica.collector.torch_ops import TorchOpsRecorder
from eroica.schema.patterns import CollectorGap, JobInfo

WINDOW_HOUR = 3600.0


def window_id(plan: WindowPlan) -> str:
    return f"w{plan.index:03d}-s{plan.start_step}"


class WindowLifecycle:
    """Open -> record -> close of one window at a time, with the hourly budget of windows."""

    def __init__(self, sampler: SamplerClient | HostSamplerClient | None) -> None:
        self.plan: WindowPlan | None = None
        self.recording = False
        self.sampler = sampler
        self.ops = TorchOpsRecorder()
        self.gc = GcHook(self.record)
        self.stacks: StackSampler | None = None
        self.events: list[Execution] = []
        self.events_dropped = 0
        self.max_events = 0
        self.bounds: list[int] = []
        self.gaps: list[CollectorGap] = []          # this window's own gaps
        self.opened_at: deque[float] = deque()     # monotonic times windows opened, for the hourly budget
        self.opened_unix = 0.0

    def may_open(self, per_hour: int) -> bool:
        cutoff = time.monotonic() - WINDOW_HOUR
        while self.opened_at and self.opened_at[0] < cutoff:
            self.opened_at.popleft()
        return len(self.opened_at) < per_hour

    def refund(self) -> None:
        """The last window was quiet (the job ran at speed after it): it is not counted in the hour's budget."""
        if self.opened_at:
            self.opened_at.pop()

    def overdue(self, max_seconds: float) -> bool:
        return bool(self.opened_at) and time.monotonic() - self.opened_at[-1] > max_seconds

    def record(self, ex: Execution) -> None:
        """One execution from a region, the loader or the GC hook; beyond the cap it is counted, not kept."""
        if not self.recording:
            return
        if len(self.events) >= self.max_events:
            self.events_dropped += 1
            return
        self.events.append(ex)

    def open(self, plan: WindowPlan, step: int, policy: TriggerPolicy) -> None:
        self.plan = plan
        self.opened_at.append(time.monotonic())
        self.opened_unix = time.time()
        self.events, self.events_dropped, self.max_events = [], 0, policy.max_events
        self.gaps = []
        if self.sampler is not None and not self.sampler.start(
            policy.sample_interval_seconds, capacity=20_000, nic_interval=policy.nic_sample_interval_seconds,
            nic_duty=policy.nic_sample_duty_ratio,
        ):
            self.gaps.append(CollectorGap(source="sampler", reason="hardware sampler unavailable"))
        gap = self.ops.start(policy.op_detail)
        if gap is not None:
            self.gaps.append(gap)
        self.gc.install()
        if policy.stack_sample_interval_seconds > 0:
            self.stacks = StackSampler(policy.stack_sample_interval_seconds)
            gap = self.stacks.start()               # the training thread: the one opening the window
            if gap is not None:
                self.gaps.append(gap)
        self.recording = True
        self.ops.mark_step(step)
        self.bounds = [time.monotonic_ns()]

    def step_ended(self, now_ns: int) -> None:
        self.bounds.append(now_ns)

    def step_started(self, step: int) -> None:
        self.ops.mark_step(step)

    def close(self, job: JobInfo, gaps: list[CollectorGap], config: dict[str, str], before: list[float],
              baseline: float | None, detector: tuple[float, int], trace_path: str | None,
              policy: TriggerPolicy, config_since: dict[str, int] | None = None,
              ) -> tuple[WindowRecord, list[CollectorGap]]:
        """Stop every recorder; the window's record, and the sampler's gaps that are new to the process."""
        plan = self.plan
        assert plan is not None
        self.recording = False
        self.plan = None
        self.gc.remove()
        ops = self.ops.stop(policy.max_events, trace_path, policy.raw_trace_max_bytes)
        series = self.sampler.stop() if self.sampler is not None else None
        new = [g for g in (self.sampler.gaps if self.sampler is not None else []) if g not in gaps]
        sampled: list[Execution] = []
        config = dict(config)
        if self.stacks is not None and len(self.bounds) >= 2:
            sampled, sites, gap = self.stacks.stop(self.bounds[0], self.bounds[-1])
            for key, site in sites.items():       # first wins, bounded, like every other site
                remember_site(config, key, site)
            if gap is not None:
                self.gaps.append(gap)
        elif self.stacks is not None:
            self.stacks.stop_thread()
        self.stacks = None
        rec = WindowRecord(
            job=job, window_id=window_id(plan), start_step=plan.start_step, trigger=plan.trigger,
            triggered_by_rank=plan.triggered_by_rank, step_bounds_ns=list(self.bounds), before_seconds=before,
            baseline_median_seconds=baseline, executions=ops.executions + self.events + sampled, samples=series,
            gaps=gaps + new + self.gaps + ops.gaps, config=config, config_since=dict(config_since or {}),
            events_dropped=ops.dropped + self.events_dropped, detector_seconds_total=detector[0],
            detector_calls_total=detector[1], raw_trace_bytes=ops.raw_trace_bytes,
            autograd_nodes=ops.autograd_nodes, autograd_nodes_until_ns=ops.autograd_nodes_until_ns,
        )
        self.events = []
        return rec, new

    def stop_recording(self) -> None:
        """Stop taking events (the Monitor was disabled); the recorders close at `close` or process exit."""
        self.recording = False
        self.gc.remove()
        if self.stacks is not None:
            self.stacks.stop_thread()
