"""Function executions from the PyTorch profiler during a window (CPU ops; CUDA activities when a GPU exists).

The profiler runs with a choice of RecordFunction scopes (`TriggerPolicy.op_detail`):
- `light` (default): on a rank without CUDA, no profiler session at all: `hooks.light` records the
  framework's Python-level functions and the user's under the profiler's names
  (`DistributedDataParallel.forward`, `Optimizer.step#SGD.step`, `record_function` regions), the
  collectives called from Python, and the backward pass as one function with DDP's wait for its
  gradient all-reduces after it, and counts its autograd nodes by type; on a CUDA rank it is
  `framework`;
- `framework`: the framework's own functions and the user's: module and optimizer
  wrappers (`DistributedDataParallel.forward`, `Optimizer.step#SGD.step`), autograd nodes
  (`AddmmBackward0`), collectives (`gloo:all_reduce`), `record_function` regions. About a tenth of
  the events of every operator, so the window costs a fraction of what `torch.profiler` does
  (bench/overhead.py); the nested aten operators they contain are not seen one by one;
- `all`: every aten operator as well, at the profiler's full cost.
CUDA activities (kernels, memcpy, memset) come from CUPTI either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eroica.collector.classify import classify_op, kernel_name
from eroica.collector.critical import Execution, device_first
from eroica.collector.hooks.light import LightRecorder
from eroica.schema.patterns import Category, CollectorGap

STEP_MARKER = "eroica.step"
MAX_NAME = 200          # characters of an op or kernel name kept (kernel names can run to kilobytes)
#: the profiler's own work on the training thread (CUPTI handing kineto its activity buffers: 0.8-0.9
#: ms per step on every rank of a GPU job on an H200), not the job's
PROFILER_OWN = frozenset({"Activity Buffer Request"})


@dataclass
class OpsResult:
    executions: list[Execution]
    dropped: int
    gaps: list[CollectorGap] = field(default_factory=list)
    raw_trace_bytes: int = 0
    # a light window's backward calls: (start, autograd nodes by type); the profiler's rows have them
    autograd_nodes: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    autograd_nodes_until_ns: int = 0        # counting stopped here, the graph static (0: never stopped)


# wrappers that hold other work and waits: Lightning and other frameworks run forward and backward in a
# closure inside `optimizer.step(closure)`, FSDP's hooks gather and reduce-scatter parameters; only the
# time not spent in what they contain, nor waiting on a collective, is theirs
TRANSPARENT = ("Optimizer.step#", "Optimizer.zero_grad#", "FSDP::")


def _subtract(s: int, e: int, busy: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[s, e) less the intervals in `busy` (sorted by start)."""
    out, t = [], s
    for bs, be in busy:
        if bs >= e:
            break
        if be <= t:
            continue
        if bs > t:
            out.append((t, bs))
        t = max(t, be)
    if t < e:
        out.append((t, e))
    return out


def _open_wrappers(rows: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Replace each transparent wrapper that contains other ops (rows sorted by start) by the pieces
    of it they do not cover (its self time), so what runs inside it keeps its own name."""
    out: list[tuple[int, int, str]] = []
    for i, (s, e, name) in enumerate(rows):
        if not name.startswith(TRANSPARENT):
            out.append((s, e, name))
            continue
        inside = []
        for j in range(i + 1, len(rows)):
            if rows[j][0] >= e:
                break
            inside.append((rows[j][0], rows[j][1]))
        out.extend((a, b, name) for a, b in _subtract(s, e, inside))
    out.sort()
    return out


def _yield_to_collectives(execs: list[Execution]) -> list[Execution]:
    """A wrapper's self time while a collective of this rank is in flight is the wait for it (DDP's
    reducer waits inside Lightning's closure): the collective holds those instants, not the wrapper."""
    busy = sorted((x.start_ns, x.end_ns) for x in execs if x.category == Category.communication)
    if not busy:
        return execs
    out: list[Execution] = []
    for x in execs:
        if x.name.startswith(TRANSPARENT):
            out.extend(Execution(a, b, x.category, x.name) for a, b in _subtract(x.start_ns, x.end_ns, busy))
        else:
            out.append(x)
    return out


def _outermost(rows: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Keep intervals not nested inside an earlier kept one (rows sorted by start)."""
    out: list[tuple[int, int, str]] = []
    end = -1
    for s, e, name in rows:
        if s >= end:
            out.append((s, e, name))
            end = e
        elif e > end:  # partial overlap: clip, keep the tail
            out.append((end, e, name))
            end = e
    return out


class _Session:
    """One profiler session through torch.autograd's profiler entry points (which, unlike
    torch.profiler.profile, take the RecordFunction scopes to record)."""

    def __init__(self, cuda: bool, detail: str) -> None:
        import torch
        from torch._C._profiler import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            RecordScope,
            _ExperimentalConfig,
        )

        self._torch = torch
        acts = {ProfilerActivity.CPU} | ({ProfilerActivity.CUDA} if cuda else set())
        cfg = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
        scopes = set() if detail == "all" else {RecordScope.USER_SCOPE, RecordScope.BACKWARD_FUNCTION}
        torch.autograd._prepare_profiler(cfg, acts)
        torch.autograd._enable_profiler(cfg, acts, scopes)
        self.result: Any = None

    def stop(self) -> None:
        self.result = self._torch.autograd._disable_profiler()

    def events(self) -> list[Any]:
        return list(self.result.events())

    def export_chrome_trace(self, path: str) -> None:
        self.result.save(path)


class TorchOpsRecorder:
    """Starts/stops the profiler around a window and converts its events into executions."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._light: LightRecorder | None = None
        self._marker: Any = None
        self._offset_ns = 0
        self.cuda = False

    def start(self, detail: str) -> CollectorGap | None:
        """`detail`: the policy's `op_detail` at the window's start ("light", "framework" or "all")."""
        try:
            import torch
        except Exception as exc:
            return CollectorGap(source="torch_profiler", reason=f"torch unavailable: {exc!r}"[:200])
        self.cuda = bool(torch.cuda.is_available())
        # kineto stamps events with the wall clock (ns); we work on the monotonic clock
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        if detail == "light" and not self.cuda:
            self._light = LightRecorder()
            self._light.install()
            return None
        try:
            self._prof = _Session(self.cuda, detail)       # a CUDA rank's light window is framework's
        except Exception as exc:   # another profiler already running, or an unsupported build
            self._prof = None
            return CollectorGap(source="torch_profiler", reason=f"profiler did not start: {exc!r}"[:200])
        return None

    def mark_step(self, step: int) -> None:
        """Wrap each window step in a marker: it tells us which profiler thread is the training thread.
        A light window is told the step began (it counts autograd nodes until the graph is static)."""
        if self._light is not None:
            self._light.step_started()
        if self._prof is None:
            return
        from torch.profiler import record_function

        if self._marker is not None:
            self._marker.__exit__(None, None, None)
        self._marker = record_function(f"{STEP_MARKER}#{step}")
        self._marker.__enter__()

    def stop(self, max_events: int, trace_path: str | None = None, trace_cap: int = 0) -> OpsResult:
        if self._light is not None:
            light, self._light = self._light, None
            light.remove()
            return _light_result(light, max_events, trace_path, trace_cap)
        if self._prof is None:
            return OpsResult([], 0)
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None
        prof, self._prof = self._prof, None
        prof.stop()
        gaps: list[CollectorGap] = []
        raw_bytes = 0
        events = prof.events()
        off = self._offset_ns
        main_tid = None
        for ev in events:
            if ev.name().startswith(STEP_MARKER):
                main_tid = ev.start_thread_id()
                break
        cpu_rows: dict[int, list[tuple[int, int, str]]] = {}
        device: list[Execution] = []
        n = 0
        dropped = 0
        for ev in events:
            dur = ev.duration_ns()
            if dur <= 0:
                continue
            name = ev.name()[:MAX_NAME]
            if name.startswith(STEP_MARKER) or name.startswith("ProfilerStep#") or name in PROFILER_OWN:
                continue
            n += 1
            if n > max_events:
                dropped += 1
                continue
            s = ev.start_ns() - off
            if str(ev.device_type()).endswith("CPU"):
                cpu_rows.setdefault(ev.start_thread_id(), []).append((s, s + dur, name))
            else:   # kernels, memcpy/memset (CUDA activities): named without template arguments
                cat = classify_op(name, on_device=True)
                device.append(Execution(s, s + dur, cat, kernel_name(name) if cat == Category.kernel else name))
        execs: list[Execution] = []
        for tid, rows in cpu_rows.items():
            rows.sort()
            for s, e, name in _outermost(_open_wrappers(rows)):
                cat = classify_op(name)
                if tid == main_tid or main_tid is None:
                    execs.append(Execution(s, e, cat, name))
                elif cat == Category.communication:
                    # collectives run on backend threads (gloo); the training thread waits on them
                    execs.append(Execution(s, e, cat, name))
        execs = _yield_to_collectives(execs)
        # on a GPU rank device work holds the critical path while the device is busy
        execs = device_first(device, execs)
        if main_tid is None:
            gaps.append(CollectorGap(source="torch_profiler", reason="training thread not identified"))
        if trace_path is not None:
            raw_bytes, gap = _export(lambda: prof.export_chrome_trace(trace_path), trace_path, trace_cap)
            if gap is not None:
                gaps.append(gap)
        return OpsResult(execs, dropped, gaps, raw_bytes)


def _light_result(light: LightRecorder, max_events: int, trace_path: str | None, trace_cap: int) -> OpsResult:
    """The light recorder's rows as executions, as the profiler's are made; its own small trace."""
    comm = light.comm[:max_events]                       # collectives first, then rows up to the cap
    rows = sorted(light.rows)[:max_events - len(comm)]
    dropped = len(light.comm) + len(light.rows) - len(comm) - len(rows)
    execs = [Execution(s, e, classify_op(name), name) for s, e, name in _outermost(_open_wrappers(rows))]
    execs = _yield_to_collectives(execs + comm)
    gaps: list[CollectorGap] = []
    raw = 0
    if trace_path is not None:
        raw, gap = _export(lambda: _write_trace(execs, trace_path), trace_path, trace_cap)
        if gap is not None:
            gaps.append(gap)
    return OpsResult(execs, dropped, gaps, raw, light.nodes, light.nodes_until_ns)


def _write_trace(execs: list[Execution], path: str) -> None:
    """A Chrome trace of the executions: complete events on the monotonic clock, in microseconds."""
    import json
    import os

    events = [{"name": x.name, "cat": x.category.value, "ph": "X", "ts": x.start_ns / 1e3,
               "dur": (x.end_ns - x.start_ns) / 1e3, "pid": os.getpid(),
               "tid": "collectives" if x.category == Category.communication else "training"} for x in execs]
    with open(path, "w") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)


def _export(write: Callable[[], None], path: str, cap: int) -> tuple[int, CollectorGap | None]:
    """Write a window's raw trace; one over `cap` bytes is removed and said, as is a failed write."""
    import os

    try:
        write()
        size = os.path.getsize(path)
        if size > cap:
            os.remove(path)
            return 0, CollectorGap(source="raw_trace", reason=f"raw trace {size} B over cap")
        return size, None
    except Exception as exc:
        return 0, CollectorGap(source="raw_trace", reason=f"export failed: {exc!r}"[:200])
