"""Framework functions without a profiler session (`op_detail="light"`, the default on CPU ranks).

A profiler session costs the training thread ~3.6% of a small model's step on the 4-rank benchmark
even when it records only a handful of user-scope events a step (bench/overhead.py: a window without
the sampler against one without the sampler or the profiler): the cost is the session, not the
events. So on a rank without CUDA the window records the same functions with three Python-level
wrappers, installed at the window's start on the training thread and removed at its end:
- `record_function`: every Python `record_function` region, under the profiler's own names: the
  framework's (`DistributedDataParallel.forward`, `Optimizer.step#SGD.step`,
  `enumerate(DataLoader)#...__next__`) and the user's;
- `torch.distributed` collectives called from Python (blocking ones), named `<backend>:<op>` as the
  profiler names them (`gloo:all_reduce`); a call with `async_op=True` is not timed (its wait is
  elsewhere), nor one through a name imported before the window (`from torch.distributed import ...`);
- the backward pass (`torch.autograd.backward`, what `Tensor.backward` calls) as `autograd.backward`,
  up to the moment the autograd engine has run every node: a callback queued from a pre-hook on the
  root's node runs first among the pass's final callbacks. What follows is DDP's `finalize_backward`
  waiting for its gradient buckets' all-reduces, recorded as communication
  (`<backend>:all_reduce (gradient buckets)`) once DDP's forward has been seen in the window; without
  DDP the whole call is `autograd.backward`.
Not seen in this mode: the time of each autograd node and collectives issued from C++ other than
DDP's (`op_detail="framework"` records both, at the profiler's cost). The nodes' *counts* are kept:
before the pass, the graph is walked from the roots and its nodes counted by type (`count_nodes`,
~0.8 us a node), until SAME_STEPS window steps in a row have run the same nodes: the graph is then
static, and walking it on every step was half the wrappers' cost (a graph that changes between steps
is counted on every one). The counts are the engine's structural evidence that ranks run models of
different depth (how many times a node runs per step): without them, the held-out job's graded run,
re-recorded with the same seed, had a light window blame the deepest rank for `workload_imbalance`
(0.59) where the framework window found the group invalid; with them the light window finds it
invalid too (`ViewBackward0` 55/68/81/94 per step, as the profiler counted; the same from the
first three steps' counts). A wrapper someone else wrapped in
turn is left in place, inert. Nothing here raises into the user's code.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from eroica.collector.critical import Execution
from eroica.schema.patterns import Category

BACKWARD = "autograd.backward"
DDP_FORWARD = "DistributedDataParallel.forward"
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "recv",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "send")


class LightRecorder:
    """Rows `(start_ns, end_ns, name)` of the training thread's framework functions, and its
    communication as executions, while installed."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, str]] = []
        self.comm: list[Execution] = []
        self.nodes: list[tuple[int, dict[str, int]]] = []   # (backward's start, autograd nodes by type)
        self.nodes_until_ns = 0       # counting stopped here, the graph being static (0: every step counted)
        self._step_first = -1         # index in nodes of the current step's first call (-1: no step yet)
        self._last_step: dict[str, int] = {}      # the last finished step's node counts
        self._same_steps = 0          # finished steps in a row, up to the last, that ran those same nodes
        self.ddp = False              # DDP's forward ran on the training thread in this window
        self._active = False
        self._thread = 0
        self._backend = ""
        self._patches: list[tuple[Any, str, Any, Any]] = []     # (owner, attribute, original, wrapper)

    def install(self) -> None:
        self.rows, self.comm, self.nodes, self.ddp = [], [], [], False
        self.nodes_until_ns, self._step_first, self._last_step, self._same_steps = 0, -1, {}, 0
        self._thread = threading.get_ident()
        try:
            import torch.autograd as ag
            from torch.autograd import profiler
        except Exception:
            return
        try:
            import torch.distributed as dist
            self._backend = str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else ""
        except Exception:
            dist, self._backend = None, ""
        rf = profiler.record_function
        self._patch(rf, "__enter__", self._wrap_enter)
        self._patch(rf, "__exit__", self._wrap_exit)
        self._patch(ag, "backward", self._wrap_backward)
        if dist is not None and dist.is_available():
            from torch.distributed import distributed_c10d as c10d

            for op in COLLECTIVES:
                for owner in (dist, c10d):
                    if callable(getattr(owner, op, None)):
                        self._patch(owner, op, functools.partial(self._wrap_collective, op=op))
        self._active = True

    def remove(self) -> None:
        self._active = False
        for owner, attr, orig, wrapper in reversed(self._patches):
            try:
                if owner.__dict__.get(attr) is wrapper:
                    setattr(owner, attr, orig)
            except Exception:
                pass
        self._patches = []

    def step_started(self) -> None:
        """A window step begins (the first one right after `install`). Once SAME_STEPS finished steps in a
        row ran the same nodes, the graph is static: counting stops here (`nodes_until_ns`), and the
        counts of the steps before it are the window's. A graph that changes from step to step (dynamic
        depth, varying micro-batches) is counted on every step."""
        if self.nodes_until_ns:
            return
        if self._step_first >= 0:
            step: dict[str, int] = {}
            for _t, counts in self.nodes[self._step_first:]:
                for k, v in counts.items():
                    step[k] = step.get(k, 0) + v
            self._same_steps = self._same_steps + 1 if step and step == self._last_step else int(bool(step))
            self._last_step = step
            if self._same_steps >= SAME_STEPS:
                self.nodes_until_ns = time.monotonic_ns()
                return
        self._step_first = len(self.nodes)

    # -- the wrappers ------------------------------------------------------------------------------

    def _mine(self) -> bool:
        return self._active and threading.get_ident() == self._thread

    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        try:
            orig = owner.__dict__[attr]
            wrapper = make(orig)
            setattr(owner, attr, wrapper)
            self._patches.append((owner, attr, orig, wrapper))
        except Exception:
            pass

    def _wrap_enter(self, orig: Any) -> Any:
        rec = self

        def __enter__(self: Any) -> Any:
            out = orig(self)
            if rec._mine():
                self._eroica_t0 = time.monotonic_ns()
            return out

        return __enter__

    def _wrap_exit(self, orig: Any) -> Any:
        rec = self

        def __exit__(self: Any, *exc: Any) -> Any:
            try:
                return orig(self, *exc)
            finally:
                t0 = self.__dict__.pop("_eroica_t0", 0)
                if t0 and rec._active:
                    name = str(self.name)
                    rec.rows.append((t0, time.monotonic_ns(), name))
                    if name == DDP_FORWARD:
                        rec.ddp = True

        return __exit__

    def _wrap_collective(self, orig: Any, *, op: str) -> Any:
        rec = self
        name = f"{self._backend}:{op}" if self._backend else op

        def collective(*args: Any, **kwargs: Any) -> Any:
            if not rec._mine() or kwargs.get("async_op"):
                return orig(*args, **kwargs)
            t0 = time.monotonic_ns()
            try:
                return orig(*args, **kwargs)
            finally:
                rec.comm.append(Execution(t0, time.monotonic_ns(), Category.communication, name))

        collective.__wrapped__ = orig          # type: ignore[attr-defined]
        return collective

    def _wrap_backward(self, orig: Any) -> Any:
        rec = self
        tail = f"{self._backend}:all_reduce (gradient buckets)" if self._backend else "all_reduce (gradient buckets)"

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec._mine():
                return orig(tensors, *args, **kwargs)
            done = [0]
            handle = _arm(tensors, done) if rec.ddp else None     # a Python hook in the graph: DDP jobs only
            counts = count_nodes(tensors) if not rec.nodes_until_ns and len(rec.nodes) < MAX_COUNTED_CALLS else {}
            t0 = time.monotonic_ns()
            if counts:
                rec.nodes.append((t0, counts))
            try:
                return orig(tensors, *args, **kwargs)
            finally:
                t1 = time.monotonic_ns()
                try:
                    if handle is not None:
                        handle.remove()
                    end = done[0] if rec.ddp and t0 < done[0] <= t1 else t1
                    rec.rows.append((t0, end, BACKWARD))
                    if end < t1:
                        rec.comm.append(Execution(end, t1, Category.communication, tail))
                except Exception:
                    pass

        backward.__wrapped__ = orig          # type: ignore[attr-defined]
        backward.__doc__ = orig.__doc__
        return backward


SAME_STEPS = 3          # finished steps with the same node counts after which a window stops counting
MAX_NODES = 50_000      # nodes walked per backward call; a larger graph is counted no further
MAX_COUNTED_CALLS = 10_000   # backward calls counted per window (memory bound: micro-batches are many)


def count_nodes(tensors: Any) -> dict[str, int]:
    """The autograd nodes this backward call will run, by type (`AddmmBackward0`: how many), walked
    from the roots' nodes before the pass: the structural evidence the profiler's per-node rows give
    (a model of another depth runs another number of them). ~0.8 us a node; {} when it cannot tell
    (a graph over MAX_NODES is not a count)."""
    try:
        roots = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
        stack = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None]
        seen = set(stack)
        counts: dict[str, int] = {}
        while stack:
            node = stack.pop()
            name = node.name()
            counts[name] = counts.get(name, 0) + 1
            for nxt, _ in node.next_functions:
                if nxt is not None and nxt not in seen:
                    if len(seen) >= MAX_NODES:
                        return {}
                    seen.add(nxt)
                    stack.append(nxt)
        return counts
    except Exception:
        return {}


def _arm(tensors: Any, done: list[int]) -> Any:
    """A pre-hook on the first root's node that queues the end-of-nodes callback (None: not armed)."""
    try:
        from torch.autograd import Variable

        root = tensors[0] if isinstance(tensors, (tuple, list)) else tensors
        node = root.grad_fn
        if node is None:
            return None

        def stamp() -> None:
            done[0] = time.monotonic_ns()

        def queue(*_: Any) -> None:
            try:
                Variable._execution_engine.queue_callback(stamp)
            except Exception:
                pass

        return node.register_prehook(queue)
    except Exception:
        return None
