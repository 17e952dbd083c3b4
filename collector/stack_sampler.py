"""Where the training thread's own Python time goes, in a job nobody instrumented.

While a window is open, a daemon thread reads the training thread's stack every few milliseconds
(`sys._current_frames()`) and keeps its innermost *user* frame: the first frame, from the innermost
out, in a file outside the standard library, installed packages and eroica. Time inside a training
framework's own Python (torch, Lightning, transformers, accelerate, DeepSpeed: a pipeline schedule,
a module's hooks) is the framework's, not the user function that called it (its blocking I/O calls,
torch.save and torch.load, excepted: there the user's function waits), and so is eroica's own
(a store poll inside `mon.step()`): a sample whose stack passes through one before it reaches user
code is left to `untracked` (the loop's own function would otherwise be named for every such call).
A run of samples in one user function becomes an execution of that function (category `python`, the
function's name), so it holds the critical path only where no recorded function does: the time that
was `untracked` is named after the user's function that spent it (a blocking metrics call in the
step: `report_metrics`), and where it is called from is kept as a site (`site.function.NAME`:
`path:line < path:line`) for a drafted fix to find the call. Time the sampler cannot place stays
`untracked`.

Bounded: at most MAX_SAMPLES per window, one frame walk of at most MAX_DEPTH frames per sample. It
never raises into the training loop; a failure to start or to sample is returned as a gap."""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from types import CodeType, FrameType

from eroica.collector.critical import Execution
from eroica.collector.sites import OURS
from eroica.schema.patterns import Category, CollectorGap

#: the training frameworks: a sample inside their Python is theirs, never the calling user function's
FRAMEWORKS = tuple(f"{os.sep}{name}{os.sep}" for name in ("torch", "lightning", "pytorch_lightning", "transformers",
                                                          "accelerate", "deepspeed", "megatron", "apex",
                                                          "torchvision", "torchtext", "torchaudio"))
#: a framework's blocking I/O calls: the calling user function waits in them as in a blocking HTTP
#: client (a torch.save to a slow volume is the user's save_checkpoint), not the framework's own work
BLOCKING_CALLS = tuple(f"{os.sep}torch{os.sep}{name}" for name in ("serialization.py", "_weights_only_unpickler.py"))
MAX_SAMPLES = 20_000         # per window: 200 s at 10 ms
MAX_DEPTH = 64               # frames walked per sample
SITE_FRAMES = 3              # user frames kept per site, innermost first


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(os.path.abspath(p) + os.sep for p in sys.path if p.rstrip(os.sep).endswith(("site-packages",
                                                                                              "dist-packages")))
    return tuple(sorted(roots))


_LIBRARY = _library_roots()


def is_user_file(filename: str) -> bool:
    """A file of the user's own code: not the standard library, an installed package, eroica or a
    synthetic `<...>` source."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_LIBRARY) and not path.startswith(OURS)


def _kind(filename: str) -> str:
    """"user"; "framework": a training framework's own Python, or eroica's (a store poll in
    `mon.step()` is eroica's time, not the loop's); "other": the standard library or another package,
    passed through on the way to the user's frame (a blocking HTTP client is the calling function's)."""
    if is_user_file(filename):
        return "user"
    if filename.endswith(BLOCKING_CALLS):
        return "other"
    return "framework" if os.path.abspath(filename).startswith(OURS) or any(f in filename for f in FRAMEWORKS) \
        else "other"


class StackSampler:
    """One window's sampling of one thread; `start` then `stop`, repeatedly."""

    def __init__(self, interval_seconds: float = 0.01) -> None:
        self.interval = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target = 0
        self._samples: list[tuple[int, CodeType | None]] = []   # (monotonic ns, innermost user code or None)
        self._sites: dict[CodeType, str] = {}
        self._user: dict[str, str] = {}                           # file name -> _kind (cached)
        self.error: str | None = None

    def start(self, thread_id: int | None = None) -> CollectorGap | None:
        """Sample `thread_id` (the caller's thread by default) until `stop`."""
        try:
            self.stop_thread()
            self._target = thread_id if thread_id is not None else threading.get_ident()
            self._samples, self._sites, self.error = [], {}, None
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="eroica-stack-sampler", daemon=True)
            self._thread.start()
            return None
        except Exception as exc:                   # noqa: BLE001 - never into the training loop
            self._thread = None
            return CollectorGap(source="stack_sampler", reason=f"not started: {type(exc).__name__}: {exc}"[:200])

    def stop_thread(self) -> None:
        t = self._thread
        if t is not None:
            self._stop.set()
            t.join(timeout=1.0)
        self._thread = None

    def stop(self, t0_ns: int, t1_ns: int) -> tuple[list[Execution], dict[str, str], CollectorGap | None]:
        """End sampling; the user functions' executions within [t0, t1], their sites (`function.NAME` ->
        `path:line < ...`) and a gap when sampling failed or was cut short."""
        self.stop_thread()
        try:
            out = self._executions(t0_ns, t1_ns)
            sites = {f"function.{code.co_name}": site for code, site in self._sites.items()
                     if any(e.name == code.co_name for e in out)}
        except Exception as exc:                   # noqa: BLE001
            return [], {}, CollectorGap(source="stack_sampler", reason=f"{type(exc).__name__}: {exc}"[:200])
        gap = None
        if self.error is not None:
            gap = CollectorGap(source="stack_sampler", reason=self.error[:200])
        elif len(self._samples) >= MAX_SAMPLES:
            gap = CollectorGap(source="stack_sampler", reason=f"stopped at {MAX_SAMPLES} samples: the window's "
                               "later user time is untracked")
        return out, sites, gap

    def _run(self) -> None:
        samples, frames, wait = self._samples, sys._current_frames, self._stop.wait
        try:
            while not wait(self.interval) and len(samples) < MAX_SAMPLES:
                f = frames().get(self._target)
                if f is None:
                    break                          # the thread is gone
                samples.append((time.monotonic_ns(), self._user_code(f)))
        except Exception as exc:                   # noqa: BLE001 - a dead sampler is a gap, not a crash
            self.error = f"sampling stopped: {type(exc).__name__}: {exc}"

    def _user_code(self, f: FrameType | None) -> CodeType | None:
        """The innermost user frame's code; None when the stack passes through a framework's frame
        first (its time), or holds no user frame."""
        user = self._user
        for _ in range(MAX_DEPTH):
            if f is None:
                return None
            code = f.f_code
            kind = user.get(code.co_filename)
            if kind is None:
                kind = user[code.co_filename] = _kind(code.co_filename)
            if kind == "framework":
                return None
            if kind == "user":
                if code not in self._sites:
                    self._sites[code] = self._site(f)
                return code
            f = f.f_back
        return None

    def _site(self, f: FrameType | None) -> str:
        out: list[str] = []
        for _ in range(MAX_DEPTH):
            if f is None or len(out) >= SITE_FRAMES:
                break
            if is_user_file(f.f_code.co_filename):
                out.append(f"{os.path.abspath(f.f_code.co_filename)}:{f.f_lineno}")
            f = f.f_back
        return " < ".join(out)

    def _executions(self, t0: int, t1: int) -> list[Execution]:
        """Runs of samples in one user function, each from the midpoint with the sample before to the
        midpoint with the sample after (at most one interval beyond its own samples), within [t0, t1]."""
        samples = [(t, c) for t, c in self._samples if t0 <= t <= t1]
        half = int(self.interval * 1e9 / 2)
        out: list[Execution] = []
        i, n = 0, len(samples)
        while i < n:
            code = samples[i][1]
            j = i
            while j + 1 < n and samples[j + 1][1] is code:
                j += 1
            if code is not None:
                # a pause between samples longer than an interval (the sampler waited for the GIL)
                # is not claimed past one interval on either side
                start = max((samples[i - 1][0] + samples[i][0]) // 2 if i > 0 else t0, samples[i][0] - 2 * half)
                end = min((samples[j][0] + samples[j + 1][0]) // 2 if j + 1 < n else t1, samples[j][0] + 2 * half)
                if end > start:                    # samples lie in [t0, t1], so do their midpoints
                    out.append(Execution(start, end, Category.python, code.co_name))
            i = j + 1
        return out
