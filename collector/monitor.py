"""The Monitor: the one object a training script holds. It never raises into the training loop."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from eroica.collector import sites
from eroica.collector.control import ControlAgent, ControlChange, apply_change
from eroica.collector.critical import Execution
from eroica.collector.detector import StepTimeDetector
from eroica.collector.gather import PatternGather, scope_of
from eroica.collector.hang import HangWatch
from eroica.collector.hang_clock import hang_clock
from eroica.collector.hooks.loader import TimedLoader
from eroica.collector.host_sampler import open_sampler
from eroica.collector.jobinfo import date_settings, device_of, dist_info, framework_config, job_name
from eroica.collector.layout import process_group_layout
from eroica.collector.output import PatternOutput
from eroica.collector.policy import TriggerPolicy
from eroica.collector.privacy import Privacy, agree_salt, level_from
from eroica.collector.raw_keep import RawTraceKeeper, busy_score, trace_target
from eroica.collector.sink import PatternSink, make_sink, sink_job_id, sink_job_name  # noqa: F401 (re-export)
from eroica.collector.store_worker import StoreWorker
from eroica.collector.summarize import summarize
from eroica.collector.sync import LocalStore, WindowCoordinator, WindowPlan
from eroica.collector.window import WindowLifecycle, window_id
from eroica.schema.patterns import Category, CollectorGap, JobInfo

log = logging.getLogger("eroica.collector")
FORCE_ENV = "EROICA_FORCE_WINDOW_AT_STEP"
# The detector judges calm steps in turns of this many: right after the user's step the caches and the
# TLB hold the user's data, and a turn's first step costs several times the next ones (bench/overhead.py;
# docs/benchmarks.md, "Costs behind design choices"). A step above the detector's threshold is judged
# at once, so the fast test fires at the step it would step by step; the sustained test, up to this
# many - 1 steps later.
JUDGE_EVERY_STEPS = 8
CONFIG_EVERY_STEPS = 50     # settings are read again this often (18 us each): a change is dated this closely
INF = float("inf")


MAX_NAME = 200          # characters of a function or region name kept


class Monitor:
    """The public facade for one training process: the step-time detector and when windows open
    (agreed through the store), over a window lifecycle (`collector/window.py`: recorders, bounded
    events) and an output path (`collector/output.py`: privacy, gather, writer).

    >>> mon = Monitor(out_dir="runs/job1")          # after dist.init_process_group(...)
    >>> loader = mon.wrap_loader(loader)
    >>> with mon.region("forward"): ...
    >>> mon.step()                                  # once per iteration
    >>> mon.close()
    """

    # zero-code attach (`collector/attach.py`) sets it: a Monitor the user makes wins over the attached one
    created_hook: ClassVar[Callable[[Monitor], None] | None] = None

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        policy: TriggerPolicy | None = None,
        role: str = "worker",
        store: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        gather: bool | str | None = None,
        privacy: str | None = None,
        job: str | None = None,
        sink: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.gaps: list[CollectorGap] = []
        self.windows_completed: list[str] = []
        self.windows_closed = 0
        self.quiet_windows = 0               # detector windows that found the job at speed (not in the budget)
        self.disabled = False
        self._warned: set[str] = set()
        self._win = WindowLifecycle(None)
        self._pending: WindowPlan | None = None
        self._windows_opened = 0
        self._step = 0                                  # index of the step now running
        self._last_ns: int | None = None
        self._exclude_next = False
        self._unjudged: list[tuple[int, float, bool]] = []   # (step, seconds, excluded) the detector has not seen
        self._det_seconds = 0.0
        self._det_calls = 0
        self._win_seconds_this_call = 0.0
        self.config: dict[str, str] = {}
        self._config_seen: dict[str, str] = {}
        self._config_since: dict[str, int] = {}     # the step each setting took its value (0: from the start)
        self._sited: set[str] = set()               # region names whose site was looked up
        self._out: PatternOutput | None = None
        self._control: ControlAgent | None = None
        self._not_eligible: str | None = None
        self.job_name = ""
        self._store: StoreWorker | None = None
        self._hang: HangWatch | None = None
        self._sink: PatternSink | None = None
        self._raw: RawTraceKeeper | None = None
        try:
            self.policy = TriggerPolicy.from_env(policy)
            r, w, backend, job_store = dist_info()
            self.rank = r if rank is None else rank
            self.world_size = w if world_size is None else world_size
            self.job = JobInfo(
                rank=self.rank,
                world_size=self.world_size,
                local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                hostname=socket.gethostname(),
                pid=os.getpid(),
                role=role,
                backend=backend,
                device=device_of(int(os.environ.get("LOCAL_RANK", 0))),
            )
            store = store if store is not None else job_store
            if store is None:
                if self.world_size > 1:
                    self._gap("store", "no torch.distributed store: windows cannot be synchronized; detector off")
                store = LocalStore()
            self._coord = WindowCoordinator(store, self.rank)
            self._store = StoreWorker()
            # control keys go to the store itself, under the group prefixes torch adds: `eroica control
            # --store HOST:PORT` reaches them without knowing the job's process-group names
            raw = getattr(store, "_underlying_non_prefix_store", store)
            self._control = ControlAgent(raw, self.rank, self.out_dir, self.policy.control_lead_steps)
            self._raw = RawTraceKeeper(raw if job_store is not None else None, self.rank, self.world_size,
                                       self.policy.raw_trace_max_ranks, self.policy.raw_trace_wait_seconds,
                                       lambda text: self._gap("raw_trace", text))
            self._raw.on_kept = self._send_trace
            level = level_from(privacy)
            gather_group = None
            self._sink = make_sink(sink, job_name(job), self.out_dir, self.rank)
            scope = scope_of(gather, self.world_size, self._sink is not None)
            if scope is not None and self.world_size > 1 and backend != "none":
                try:   # every rank builds the group here, at the same point
                    gather_group = PatternGather(self.policy.gather_timeout_seconds, scope)
                except Exception as exc:
                    self._gap("gather", f"no gloo group to gather patterns ({exc!r}); each rank writes its own file")
            self._out = PatternOutput(self.out_dir, self.rank,
                                      Privacy(level, agree_salt(store) if level != "keep" else ""), gather_group,
                                      self.gaps.append, self._sink)
            self._detector = StepTimeDetector(self.policy)
            self.job_name = job_name(job)
            self._not_eligible = self.policy.eligible(self.job_name, self.world_size)
            if self._not_eligible:   # the job's name stays in the process unless names are kept
                why = self._not_eligible if level == "keep" else "not covered by eligible_jobs/min_world_size"
                self._gap("policy", f"detector off: {why}; requested windows still open")
            force = os.environ.get(FORCE_ENV)
            if force:
                self._pending = WindowPlan(0, int(force), "forced", None)
            self._collect_config()
            sites.install_loader_sites()
            if self.policy.hang_enabled:
                self._hang = HangWatch(self.rank, self.world_size, self.out_dir, raw if job_store is not None else None,
                                       hang_clock(self.policy), self.policy.hang_poll_seconds, self.job_name,
                                       self._sink.submit_hang if self._sink is not None else None,
                                       native=self.policy.hang_native_dump,
                                       flush=self._sink.flush if self._sink is not None else None)
                self._hang.start()
            self._win.sampler = open_sampler(os.getpid(), threading.get_native_id(), self.policy.sampler_scope)
            self.gaps.extend(self._win.sampler.gaps)
        except Exception as exc:
            self._disable("init", exc)
        hook = Monitor.created_hook
        if hook is not None:
            with contextlib.suppress(Exception):
                hook(self)

    # ---------------------------------------------------------------- public API
    def wrap_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """Time every `next()` of the loader (data-loading stalls show up as `DataLoader.__next__`)."""
        try:
            for attr in ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers"):
                if hasattr(loader, attr):
                    self.config[f"dataloader.{attr}"] = str(getattr(loader, attr))
            sites.remember_site(self.config, "loader", getattr(loader, "_eroica_site", None) or sites.caller_site(1))
            return TimedLoader(self._record_safely, loader)
        except Exception as exc:
            self._warn("wrap_loader", exc)
            return loader

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Annotate a user region; its own time (outside torch ops) is attributed to it."""
        t0 = time.monotonic_ns() if self._win.recording else 0
        if name not in self._sited and len(self._sited) < sites.MAX_SITES:   # once per name: off the hot path
            self._sited.add(name)
            sites.remember_site(self.config, f"region.{str(name)[:MAX_NAME]}", sites.caller_site(2))
        try:
            yield
        finally:
            if t0:
                self._record_safely(t0, Category.region, name)

    def request_window(self) -> None:
        """Ask for a profiling window on every rank now (it opens `lead_steps` steps later, at the
        same step everywhere); ignored while one is open or planned. `eroica control --window-now`
        does the same from outside the job."""
        try:
            if self._win.plan is None and self._pending is None and not self.disabled:
                self._propose("requested")
        except Exception as exc:
            self._warn("request_window", exc)

    def step(self) -> None:
        """Call once per iteration, after the optimizer step."""
        if self.disabled:
            return
        t_in = time.perf_counter()
        self._win_seconds_this_call = 0.0
        if self._step == 0:
            sites.remember_site(self.config, "step", sites.caller_site(1))
        try:
            self._on_step()
        except Exception as exc:
            self._disable("step", exc)
        # window open/close time is the window's cost, not the detector's
        self._det_seconds += time.perf_counter() - t_in - self._win_seconds_this_call
        self._det_calls += 1

    def close(self) -> None:
        try:
            if self._win.plan is not None:
                self._gap("window", f"job ended inside window {self._win.plan.index}; summarizing what was seen")
                self._close_window()
        except Exception as exc:
            self._warn("close", exc)
        finally:
            self._win.stop_recording()
            if self._hang is not None:
                self._hang.close()
            if self._win.sampler is not None:
                self._win.sampler.close()
            if self._store is not None:
                self._store.close()
            if self._raw is not None:                     # the last window's keep decision, bounded
                self._raw.join(min(self.policy.close_timeout_seconds, 3.0))
            if self._sink is not None and self.rank == 0:
                self._sink.submit_end()
            if self._out is not None:
                self._out.close(self.policy.close_timeout_seconds)
            self._background_problems()

    # ---------------------------------------------------------------- internals
    def _record_safely(self, t0: int, cat: Category, name: str) -> None:
        """From the user's code paths (regions, the loader): whatever happens stays here. Names are
        cut to MAX_NAME characters, so the event buffer's bytes are bounded by its count cap."""
        try:
            self._record(Execution(t0, time.monotonic_ns(), cat, str(name)[:MAX_NAME]))
        except Exception as exc:
            self._warn("record", exc)

    def _record(self, ex: Execution) -> None:
        self._win.record(ex)

    def _gap(self, source: str, reason: str) -> None:
        gap = CollectorGap(source=source, reason=reason)
        if gap not in self.gaps:                # the config is read again at each window: said once
            self.gaps.append(gap)

    def _warn(self, where: str, exc: BaseException) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning("eroica collector: %s failed (%r); training continues", where, exc)
            self._gap(where, repr(exc)[:200])

    def _disable(self, where: str, exc: BaseException) -> None:
        self._warn(where, exc)
        self.disabled = True
        with contextlib.suppress(Exception):
            self._win.stop_recording()

    def _collect_config(self) -> None:
        if not framework_config(self.config):
            self._gap("config", "torch not importable")
        date_settings(self.config, self._config_seen, self._config_since, self._step)

    def _on_step(self) -> None:
        now = time.monotonic_ns()
        done = self._step                               # the step that just finished
        seconds = None if self._last_ns is None else (now - self._last_ns) / 1e9
        self._last_ns = now
        self._step += 1
        if self._hang is not None:
            self._hang.stepped(self._step, seconds)
        # only what has work is called (after the user's step all of it is cold, so each call costs); a failed
        # write and a stuck store are noticed within a poll's steps
        poll_step = self._step % self.policy.poll_every_steps == 0
        if self._step == 1 or self._step % CONFIG_EVERY_STEPS == 0:
            self._collect_config()                      # the settings it started with, and later changes
        if poll_step:
            self._background_problems()
        if self._store is not None and self._store.answered:
            self._store_answers()
        if self._control is not None and (self._control.pending or self._step % self.policy.control_poll_steps == 0):
            self._runtime_control()
        plan = self._win.plan
        in_window = plan is not None
        if plan is not None:
            self._win.step_ended(now)
            overdue = self._win.overdue(self.policy.max_window_seconds)
            if self._step >= plan.start_step + self._length(plan) or overdue:
                if overdue:
                    self._gap("window", f"window {plan.index} open longer than max_window_seconds "
                                        f"({self.policy.max_window_seconds:g} s): closed at step {self._step}")
                self._close_window()
                self._exclude_next = True               # the next step carries the summary cost
                self._last_ns = time.monotonic_ns()
            else:
                self._win.step_started(self._step)
        if seconds is not None and self._sink is not None and self.rank == 0:
            self._sink.step_seen(done, seconds, self.world_size)
        if seconds is not None and self.policy.enabled and not self._not_eligible:
            self._unjudged.append((done, seconds, in_window or self._exclude_next))
            if not in_window:
                self._exclude_next = False
            if len(self._unjudged) >= JUDGE_EVERY_STEPS or seconds > (self._detector.threshold_seconds() or INF):
                self._judge()
        if self._pending is None and self._win.plan is None and poll_step:
            self._poll()
        if self._win.plan is None and self._pending is not None and self._step >= self._pending.start_step:
            if self._step > self._pending.start_step:
                self._gap("window", f"window {self._pending.index} planned at step {self._pending.start_step} "
                                    f"seen at step {self._step}: started late")
            self._open_window(self._pending)

    def _judge(self) -> None:
        """The detector's turn: the steps since the last one, in order; the first that fires proposes a
        window unless one is planned or open (as it is when a window opens or closes: it sees them first)."""
        steps, self._unjudged = self._unjudged, []
        fired = None
        for done, seconds, excluded in steps:
            decision = self._detector.observe(done, seconds, excluded=excluded)
            if decision.quiet_window:           # the job ran at speed after the last window: not counted
                self.quiet_windows += 1
                self._win.refund()
            if decision.fire and fired is None:
                fired = decision
        if fired is not None and self._pending is None and self._win.plan is None and \
                self._win.may_open(self.policy.max_windows_per_hour):
            self._propose(steps=self.policy.window_length(fired.period_steps) if fired.period_steps else None)

    def _store_answers(self) -> None:
        """Pick up what the store worker answered since the last step."""
        if self._store is None:
            return
        for ans in self._store.answers():
            if ans.error is not None:
                self._warn(f"store.{ans.kind}", ans.error)
            elif ans.kind == "control" and self._control is not None:
                self._control.add(ans.value)
            elif ans.value is not None and self._win.plan is None and ans.value.index == self._windows_opened:
                self._pending = ans.value          # a plan, polled or agreed on a proposal

    def _background_problems(self) -> None:
        """What the writer threads could not do, and a store that stopped answering."""
        if self._out is not None:
            for path, exc in self._out.errors():
                source = "sink" if path == "sink" else "write"
                self._warn(source, exc)
                self._gap(source, f"{path}: {exc!r}"[:200])
        for kind in self._store.stuck() if self._store is not None else []:
            if f"store.{kind}.stuck" not in self._warned:
                self._warn(f"store.{kind}.stuck", TimeoutError("the store has not answered for 30 s"))

    def _runtime_control(self) -> None:
        """Read the published control changes every control_poll_steps; apply each at its step."""
        if self._control is None or self._store is None:
            return
        if self._step % self.policy.control_poll_steps == 0:
            agent, step = self._control, self._step
            self._store.submit("control", lambda: agent.poll(step))
        for change in self._control.due(self._step):
            self._apply_control(change)

    def _apply_control(self, change: ControlChange) -> None:
        self.policy, result = apply_change(self.policy, change)
        self._detector.policy = self.policy
        self._not_eligible = self.policy.eligible(self.job_name, self.world_size)
        if change.request.window_now and result == "applied":
            if self._win.plan is None and self._pending is None:
                self._propose("requested")
            else:
                result += "; window_now ignored: a window is already open or planned"
        if self._step > change.effective_step:
            self._gap("control", f"change {change.seq} read late: applied at step {self._step}, "
                                 f"meant for step {change.effective_step}")
        self.config["eroica.control"] = f"change {change.seq} by {change.request.who} at step {self._step}: {result}"
        try:
            assert self._control is not None
            self._control.record(change, self._step, result)
        except Exception as exc:
            self._warn("control.log", exc)

    def _propose(self, trigger: str = "detector", steps: int | None = None) -> None:
        """Propose a window `lead_steps` ahead (`steps` long: a periodic slowdown's whole period; None:
        the policy's); the agreed plan (another rank may have won) arrives through the store worker."""
        if self._store is None:
            return
        coord, index, target = self._coord, self._windows_opened, self._step + self.policy.lead_steps
        self._store.submit("propose", lambda: coord.propose(index, target, trigger, steps))

    def _length(self, plan: WindowPlan) -> int:
        """An agreed plan's length (its own, bounded by this rank's policy, or the policy's)."""
        return min(plan.steps, self.policy.max_window_steps) if plan.steps else self.policy.window_steps

    def _poll(self) -> None:
        if self._store is None or self._store.in_flight("propose"):
            return
        coord, index = self._coord, self._windows_opened
        self._store.submit("poll", lambda: coord.poll(index))

    def _open_window(self, plan: WindowPlan) -> None:
        t_in = time.perf_counter()
        try:
            self._open_window_inner(plan)
        finally:
            self._win_seconds_this_call += time.perf_counter() - t_in

    def _open_window_inner(self, plan: WindowPlan) -> None:
        self._judge()                   # while the plan is pending: a firing among these steps proposes nothing
        self._pending = None
        self._collect_config()          # configuration can change while the job runs
        self._windows_opened = max(self._windows_opened, plan.index) + 1
        self._detector.window_scheduled(plan.start_step + self._length(plan),
                                        judged=plan.trigger == "detector" and not plan.steps)
        self._win.open(plan, self._step, self.policy)

    def _close_window(self) -> None:
        t_in = time.perf_counter()
        try:
            self._close_window_inner()
        finally:
            self._win_seconds_this_call += time.perf_counter() - t_in

    def _close_window_inner(self) -> None:
        plan = self._win.plan
        assert plan is not None
        self.windows_closed += 1
        t_sum = time.monotonic()
        t_closed = time.time()
        wid = window_id(plan)
        final = self.out_dir / wid / f"rank-{self.rank}.trace.json"
        trace_path, elect = trace_target(self.policy.keep_raw_trace, self._out is None or self._out.keeps_names,
                                         self._raw is not None, final, self.rank,
                                         lambda t: self._gap("raw_trace", t))
        self._judge()
        history = list(self._detector.history)
        n_window = len(self._win.bounds) - 1
        before = history[: max(len(history) - n_window, 0)]   # the job's recent series: periods, its level
        layout = process_group_layout()
        if layout:
            self.job = self.job.model_copy(update={"process_groups": layout})
        date_settings(self.config, self._config_seen, self._config_since, self._step)
        rec, new_gaps = self._win.close(self.job, self.gaps, self.config, before,
                                        self._detector.window_baseline_seconds, (self._det_seconds, self._det_calls),
                                        trace_path, self.policy, self._config_since)
        self.gaps.extend(new_gaps)
        doc = None
        if len(rec.step_bounds_ns) < 2:
            self._gap("window", f"window {wid} closed before a full step; nothing written")
        else:
            try:   # a window that cannot be summarized is lost alone, the Monitor goes on
                doc = summarize(rec, t_sum, time.monotonic())
                stamps = {"opened_unix_seconds": round(self._win.opened_unix, 3),
                          "closed_unix_seconds": round(t_closed, 3)}
                doc = doc.model_copy(update={"window": doc.window.model_copy(update=stamps)})
                if self._out is not None:
                    doc = self._out.private(doc)
            except Exception as exc:
                self._warn("summarize", exc)
                doc = None
        if self._out is not None and self._out.publish(wid, doc):
            self.windows_completed.append(wid)
        if elect and trace_path is not None and self._raw is not None:
            self._raw.offer(wid, busy_score(doc) if doc is not None else 0.0, Path(trace_path), final)
        elif trace_path is not None and final.exists():
            self._send_trace(wid, final)

    def _send_trace(self, wid: str, path: Path) -> None:
        """A kept raw trace goes to the service too (its job page links it); a full queue is a gap."""
        if self._sink is not None and not self._sink.submit_trace(wid, self.rank, self.world_size, self.job.hostname,
                                                                  path):
            self._gap("sink", f"raw trace of {wid} not sent to {self._sink.url}: earlier items still pending")
