"""Offline ingestion of PyTorch profiler (Kineto) Chrome-trace JSON into `eroica.patterns/v1`.

One file per rank, plain or gzip. msgspec decodes the bytes straight into the few fields
eroica needs (an event is a five-field struct, never a dict of everything), so a trace costs its
bytes plus those structs. A file over FAST_MAX_BYTES, or one whose events do not have the usual
types, is streamed instead: the top-level object key by key and `traceEvents` element by element.
Each rank is summarized on its own clock (timestamps are never compared across ranks) with the
live collector's own critical-path attribution and summary:

- device work holds the critical path by priority: kernels > memory ops > communication kernels;
- where the device is idle, the CPU-side work of the thread that drives the step (ops, CUDA
  runtime calls such as cudaLaunchKernel, the data loader) holds it, so a launch-bound or
  input-bound rank is found even when its kernels look normal;
- steps are bounded by their CPU-side `ProfilerStep#N` spans; the last step of a range ends when
  its device work does (kernels run past the CPU span).
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from eroica.collector.classify import classify_op, kernel_name
from eroica.collector.critical import Execution, device_first
from eroica.collector.errors import TraceError
from eroica.collector.sink import gunzip_at_most
from eroica.collector.summarize import WindowRecord, summarize
from eroica.schema.patterns import Category, CollectorGap, JobInfo, PatternsDoc

CHUNK = 1 << 20
FAST_MAX_BYTES = 256 << 20        # bytes decoded at once, after decompression; above, the stream keeps memory flat
MAX_VALUE_CHARS = 64 << 20        # one JSON value (an event, a metadata key) read by the stream, at most
_SPACE = re.compile(r"[ \t\r\n]*")
PARALLEL_MIN_BYTES = 1 << 16      # below, forking workers costs more than it saves
STEP = re.compile(r"^ProfilerStep#(\d+)$")
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_CATS = {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function"}


def _open(path: Path) -> TextIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


class _Stream:
    """Incremental JSON values from a text stream (json.JSONDecoder.raw_decode on a sliding buffer)."""

    def __init__(self, fh: TextIO, path: Path) -> None:
        self.fh, self.path, self.buf, self.pos, self.eof, self.read_total = fh, path, "", 0, False, 0
        self.dec = json.JSONDecoder()

    def _fill(self) -> bool:
        if self.eof:
            return False
        if len(self.buf) - self.pos > MAX_VALUE_CHARS:      # one value that never ends: memory stays bounded
            raise TraceError(f"{self.path}: a JSON value over {MAX_VALUE_CHARS >> 20} MB near byte "
                             f"{self.read_total + self.pos}: not an event of a Chrome trace")
        chunk = self.fh.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.read_total += self.pos
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            m = _SPACE.match(self.buf, self.pos)                    # it always matches (maybe nothing)
            self.pos = m.end() if m is not None else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise TraceError(f"{self.path}: ends early (truncated?) at byte {self.read_total + self.pos}")

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise TraceError(f"{self.path}: not JSON of a Chrome trace (expected {ch!r} at byte "
                             f"{self.read_total + self.pos}, found {self.buf[self.pos]!r})")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
                if end == len(self.buf) and not self.eof and isinstance(v, (int, float)):
                    raise json.JSONDecodeError("number may continue", self.buf, end)
                self.pos = end
                return v
            except json.JSONDecodeError as exc:
                if not self._fill():
                    raise TraceError(f"{self.path}: not valid JSON or truncated near byte "
                                     f"{self.read_total + self.pos}: {exc.msg}") from exc


def read_trace(path: Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """(metadata read so far, events) — metadata keys after `traceEvents` arrive once the events
    are consumed; the caller reads the dict again at the end."""
    meta: dict[str, Any] = {}

    def events() -> Iterator[dict[str, Any]]:
        with _open(path) as fh:
            s = _Stream(fh, path)
            try:
                s.expect("{")
            except TraceError as exc:
                raise TraceError(f"{path}: not a Chrome trace (the file is not a JSON object)") from exc
            seen = False
            while s.peek() != "}":
                key = s.value()
                s.expect(":")
                if key == "traceEvents":
                    seen = True
                    s.expect("[")
                    while s.peek() != "]":
                        ev = s.value()
                        if isinstance(ev, dict):
                            yield ev
                        if s.peek() == ",":
                            s.pos += 1
                    s.pos += 1
                else:
                    meta[str(key)] = s.value()
                if s.peek() == ",":
                    s.pos += 1
            if not seen:
                raise TraceError(f"{path}: not a Chrome trace: no traceEvents (keys: {', '.join(sorted(meta))[:200]})")

    return meta, events()


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    ts: float | None = None
    dur: float = 0.0


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None           # noqa: N815 (the trace's own key)
    distributedInfo: dict[str, Any] | None = None     # noqa: N815
    hostname: str | None = None


_DECODER = msgspec.json.Decoder(_Trace)


def _fast(path: Path) -> tuple[dict[str, Any], _Rank] | None:
    """The whole file decoded at once into the fields eroica reads; None when it is too big or its
    events are not of the usual types (then the stream reads it)."""
    try:
        if path.stat().st_size > FAST_MAX_BYTES:
            return None
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b" and int.from_bytes(raw[-4:], "little") > FAST_MAX_BYTES:
            return None                   # gzip's own record of its size (mod 4 GiB): too big to decode at once
        if raw[:2] == b"\x1f\x8b":
            # bounded: what is too big once decompressed goes to the stream, whose memory stays flat
            raw = gunzip_at_most(raw, FAST_MAX_BYTES)
        t = _DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
        return None
    if t.traceEvents is None:
        return None
    meta = {k: v for k, v in (("distributedInfo", t.distributedInfo), ("hostname", t.hostname)) if v is not None}
    r = _Rank()
    for ev in t.traceEvents:
        if ev.ph == "X" and ev.ts is not None:
            s = int(ev.ts * 1000)
            r.add(ev.cat or "", ev.name, s, s + int(ev.dur * 1000))
    return meta, r


@dataclass
class _Rank:
    steps: list[tuple[int, int, int]] = field(default_factory=list)        # (step number, start, end) ns
    cpu: list[tuple[int, int, str, str]] = field(default_factory=list)      # start, end ns, cat, name
    device: list[tuple[int, int, str, str]] = field(default_factory=list)   # start, end ns, cat, name

    def add(self, cat: str, name: str, s: int, e: int) -> None:
        """One complete ('X') event: a profiler step, CPU-side work, device work, or nothing kept."""
        m = STEP.match(name) if cat in CPU_CATS else None      # not its gpu_user_annotation twin
        if m:
            self.steps.append((int(m.group(1)), s, e))
        elif cat in DEVICE_CATS:
            self.device.append((s, e, cat, name))
        elif cat in CPU_CATS:
            self.cpu.append((s, e, cat, name))


def _collect(events: Iterator[dict[str, Any]]) -> _Rank:
    r = _Rank()
    for ev in events:
        if ev.get("ph") != "X":
            continue
        try:
            s = int(float(ev["ts"]) * 1000)
            e = s + int(float(ev.get("dur", 0)) * 1000)
        except (KeyError, TypeError, ValueError):
            continue
        r.add(ev.get("cat") or "", str(ev.get("name", "")), s, e)
    return r


def _executions(r: _Rank) -> list[Execution]:
    """Every execution on this rank's clock. Every CPU thread counts (the autograd engine runs
    backward on threads of its own)."""
    # device work: by priority (kernels > memory > communication); its union is the busy device
    dev: list[Execution] = []
    for s, e, cat, name in r.device:
        c = classify_op(name, on_device=True) if cat == "kernel" else Category.memory
        dev.append(Execution(s, e, c, kernel_name(name) if cat == "kernel" else name))
    host: list[Execution] = []
    for s, e, cat, name in r.cpu:
        if cat == "user_annotation" and not classify_op(name) == Category.data:
            continue                                   # `## forward ##` markers: their ops are events too
        c = Category.compute if cat in ("cuda_runtime", "cuda_driver") else classify_op(name)
        host.append(Execution(s, e, c, name))
    return device_first(dev, host)


def ingest_file(path: Path, rank: int | None = None, world_size: int | None = None) -> list[PatternsDoc]:
    """One pattern document per contiguous range of profiled steps."""
    fast = _fast(path)
    if fast is not None:
        meta, r = fast
    else:
        meta, events = read_trace(path)
        r = _collect(events)
    info = meta.get("distributedInfo") or {}
    if rank is None:
        if "rank" in info:
            rank = int(info["rank"])
        else:
            m = RANK_IN_NAME.search(path.name)
            if not m:
                raise TraceError(f"{path}: no distributedInfo and no rank in the file name (rank3, worker3...); "
                                 f"pass --rank FILE=N")
            rank = int(m.group(1))
    world = int(world_size or info.get("world_size") or rank + 1)
    if not r.steps:
        raise TraceError(f"{path}: no ProfilerStep#N events: profile with torch.profiler.schedule and prof.step()")
    execs = _executions(r)
    r.steps.sort(key=lambda x: x[1])
    runs: list[list[tuple[int, int, int]]] = []
    for st in r.steps:                                   # one window per contiguous range of steps
        if runs and st[0] == runs[-1][-1][0] + 1:
            runs[-1].append(st)
        else:
            runs.append([st])
    job = JobInfo(rank=rank, world_size=max(world, rank + 1), hostname=str(meta.get("hostname", "trace")),
                  pid=0, backend=str(info.get("backend", "unknown")), device="cuda" if r.device else "cpu")
    docs = []
    for i, run in enumerate(runs):
        starts = [s for _, s, _ in run]
        # the last step ends when its CPU span ends or its device work does, whichever is later
        nxt = runs[i + 1][0][1] if i + 1 < len(runs) else 1 << 62
        end = max([run[-1][2]] + [e for s, e, *_ in r.device if starts[-1] <= s < nxt])
        bounds = [*starts, end]
        first = run[0][0]
        rec = WindowRecord(job=job, window_id=f"w{i:03d}-s{first}", start_step=first, trigger="requested",
                           triggered_by_rank=None, step_bounds_ns=bounds, before_seconds=[],
                           baseline_median_seconds=None, executions=execs, samples=None,
                           config={"source": "kineto"},
                           gaps=[CollectorGap(source="hardware", reason="offline trace: no hardware samples")])
        docs.append(summarize(rec, 0.0, 0.0))
    return docs


def _ingest_one(job: tuple[Path, int | None, int | None]) -> list[PatternsDoc] | TraceError | OSError:
    try:
        return ingest_file(*job)
    except (TraceError, OSError) as exc:
        return exc


def _worker_start() -> None:
    """A forked worker: what it inherited lives as long as it does (frozen: never rescanned by a
    collection, its pages stay shared), and collection runs for what it makes, even when the caller
    holds collection off while it imports."""
    import gc

    gc.freeze()
    gc.enable()


class IngestJob:
    """Each file's documents (or the error that kept it out), in order. Files are summarized on
    every core (forked workers: nothing is imported again) when there are enough bytes to pay for
    the fork; the workers start when the job is made, so the caller can do other work meanwhile (the
    CLI imports the engine). A file's error never stops the others."""

    def __init__(self, files: list[Path], ranks: dict[str, int] | None = None, world_size: int | None = None,
                 workers: int | None = None) -> None:
        import os

        self.jobs = [(f, (ranks or {}).get(f.name), world_size) for f in files]
        cpus = workers or os.cpu_count() or 1
        n = min(cpus, len(self.jobs))
        total = sum(f.stat().st_size for f in files if f.exists())
        self.pool: Any = None
        self.futures: list[Any] = []
        # even one file goes to a worker when there is a second core: the caller works meanwhile
        if cpus > 1 and n >= 1 and total >= PARALLEL_MIN_BYTES:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_worker_start)
            self.futures = [self.pool.submit(_ingest_one, job) for job in self.jobs]

    def results(self) -> Iterator[tuple[Path, list[PatternsDoc] | TraceError | OSError]]:
        try:
            for i, job in enumerate(self.jobs):
                yield job[0], self.futures[i].result() if self.pool is not None else _ingest_one(job)
        finally:
            if self.pool is not None:
                self.pool.shutdown(cancel_futures=True)


def write_doc(run_dir: Path, doc: PatternsDoc) -> Path:
    """The pattern file, as the live collector writes it (its own size recorded in it)."""
    wdir = run_dir / doc.window.window_id
    wdir.mkdir(parents=True, exist_ok=True)
    data = doc.model_dump(mode="json", by_alias=True)
    data["overhead"]["pattern_bytes"] = len(json.dumps(data, separators=(",", ":")).encode())
    out = wdir / f"rank-{doc.job.rank}.json"
    out.write_text(json.dumps(data, separators=(",", ":")))
    return out
