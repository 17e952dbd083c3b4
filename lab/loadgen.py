"""A load generator for `eroica serve`, bounded in count and time: K jobs x R ranks, each rank a
thread that ships what a real rank ships through the collector's own sink (`PatternSink`: a bounded
queue, retries, a spool, fail-open): its pattern document of each window, and on rank 0 the job's
step summaries and its end; one rank of every other job also posts a hang snapshot.

Documents are the library's recorded ranks (INC-0017) relabelled per job, rank and window, so the
service diagnoses real patterns. Everything submitted is remembered (`expected`), so that a check
afterwards can say whether every acknowledged document was stored exactly once. What the ranks'
own thread paid (`submit` never blocks: the sink is fail-open) and every POST's latency, by kind,
are measured."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eroica.collector.sink import PatternSink

INCIDENT = Path(__file__).parents[1] / "incidents" / "INC-0017" / "patterns"
SERIES = 20                        # steps per step summary, as the sink's rank 0 sends them


@dataclass(frozen=True)
class LoadSpec:
    jobs: int = 8
    ranks: int = 4
    windows: int = 6               # per job, spread over `seconds`
    seconds: float = 60.0
    tag: str = "load"
    hang_every_jobs: int = 2       # one rank of every such job posts a hang snapshot


def _template_docs() -> list[dict[str, Any]]:
    wdir = sorted(p for p in INCIDENT.iterdir() if p.is_dir())[0]
    files = sorted(wdir.glob("rank-*.json"))
    raw = [f.read_bytes() for f in files] or [ln for p in sorted(wdir.glob("pack-*.jsonl"))
                                                for ln in p.read_bytes().splitlines() if ln.strip()]
    return [json.loads(b) for b in raw]


def window_of(i: int) -> tuple[str, int, int]:
    start = 100 + 60 * i
    return f"w{i:03d}-s{start}", start, start + 8


class TimedSink(PatternSink):
    """The collector's sink, timing each POST it makes (the service's latency as a rank sees it)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        self.latencies: list[tuple[str, float, bool]] = []
        super().__init__(*a, **kw)

    def _post(self, kind: str, body: bytes) -> str | None:
        t0 = time.perf_counter()
        why = super()._post(kind, body)
        self.latencies.append((kind, time.perf_counter() - t0, why is None))
        return why


@dataclass
class Load:
    url: str
    token: str | None
    spec: LoadSpec
    spool_root: Path
    expected_docs: set[tuple[str, str, int]] = field(default_factory=set)     # (job, window, rank)
    expected_steps: dict[str, int] = field(default_factory=dict)              # job -> summaries
    expected_hangs: set[tuple[str, int]] = field(default_factory=set)
    submit_seconds: list[float] = field(default_factory=list)                 # the ranks' own wait
    submit_cpu_seconds: list[float] = field(default_factory=list)             # and their own CPU
    sinks: list[TimedSink] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def job_id(self, j: int) -> str:
        return f"{self.spec.tag}-{j:03d}"

    def run_dir(self, j: int) -> Path:
        return self.spool_root / self.job_id(j)

    def start(self) -> None:
        templates = _template_docs()
        self.started = time.time()
        for j in range(self.spec.jobs):
            for r in range(self.spec.ranks):
                t = threading.Thread(target=self._rank, args=(j, r, templates), name=f"load-{j}-{r}", daemon=True)
                self._threads.append(t)
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.finished = time.time()
        return not any(t.is_alive() for t in self._threads)

    def _submit(self, fn: Any, *args: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        ok = fn(*args)
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        with self._lock:
            self.submit_seconds.append(dt)           # with the GIL shared by this process's many ranks
            self.submit_cpu_seconds.append(dc)
            if not ok:
                self.refused.append(f"{fn.__name__}: the sink's queue was full")

    def _rank(self, j: int, r: int, templates: list[dict[str, Any]]) -> None:
        s, job = self.spec, self.job_id(j)
        sink = TimedSink(self.url, job, self.run_dir(j) / ".spool" / f"rank-{r}", token=self.token, max_pending=64,
                         attempts=2, timeout_seconds=5.0, job_name=f"{s.tag}-job-{j:03d}")
        with self._lock:
            self.sinks.append(sink)
        pace = s.seconds / max(1, s.windows)
        t_next = time.monotonic()
        for i in range(s.windows):
            wid, start, end = window_of(i)
            doc = json.loads(json.dumps(templates[r % len(templates)]))
            doc["job"].update(rank=r, world_size=s.ranks, hostname=f"node-{j:03d}-{r // 8}", local_rank=r % 8)
            doc["window"].update(window_id=wid, start_step=start, end_step=end, opened_unix_seconds=time.time(),
                                 closed_unix_seconds=time.time())
            with self._lock:
                self.expected_docs.add((job, wid, r))
            self._submit(sink.submit, json.dumps(doc))
            if r == 0:
                for first in range(start - 60 + 1 if i else 1, start + 1, SERIES):
                    self._submit(sink.submit_steps, first, first + SERIES - 1, 0.1, 0.12, s.ranks)
                    with self._lock:
                        self.expected_steps[job] = self.expected_steps.get(job, 0) + 1
            if i == s.windows // 2 and r == s.ranks - 1 and j % s.hang_every_jobs == 0:
                self._submit(sink.submit_hang, json.dumps(hang_snapshot(job, r, s.ranks, end)))
                with self._lock:
                    self.expected_hangs.add((job, r))
            t_next += pace
            time.sleep(max(0.0, t_next - time.monotonic()))
        if r == 0:
            self._submit(sink.submit_end)
        sink.close(max(10.0, s.seconds))

    # ---------------------------------------------------------------- what was measured
    def leftover_spools(self) -> list[Path]:
        return sorted(p for p in self.spool_root.glob("*/.spool/rank-*/*.json.gz"))

    def report(self) -> dict[str, Any]:
        lat: dict[str, list[float]] = {}
        failed = 0
        for sink in self.sinks:
            for kind, secs, ok in sink.latencies:
                if ok:
                    lat.setdefault(kind, []).append(secs)
                else:
                    failed += 1
        alls = sorted(x for xs in lat.values() for x in xs)
        elapsed = max(1e-9, getattr(self, "finished", time.time()) - self.started)
        return {
            "jobs": self.spec.jobs, "ranks": self.spec.ranks, "windows": self.spec.windows,
            "requests_ok": len(alls), "requests_failed": failed, "seconds": round(elapsed, 1),
            "requests_per_second": round(len(alls) / elapsed, 1),
            "latency_ms": {k: pct(sorted(v)) for k, v in sorted(lat.items())} | {"all": pct(alls)},
            "submit_max_ms": round(1000 * max(self.submit_seconds, default=0.0), 3),
            "submit_p99_ms": pct(sorted(self.submit_seconds))["p99"],
            "submit_cpu_max_ms": round(1000 * max(self.submit_cpu_seconds, default=0.0), 3),
            "sink_notes": sum(len(s.messages()) for s in self.sinks),
        }


def pct(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "n": 0}
    def at(q: float) -> float:
        return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)
    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "mean": round(1000 * statistics.fmean(xs), 2),
            "n": len(xs)}


def hang_snapshot(job: str, rank: int, world: int, step: int) -> dict[str, Any]:
    frame = {"file": "/job/train.py", "line": 40, "function": "main", "code": "loss.backward()"}
    return {"schema": "eroica.hang/v1", "job": job, "rank": rank, "world_size": world, "host": f"node-{rank // 8}",
            "pid": 1000 + rank, "wall_time": time.time(), "last_step": step, "stalled_seconds": 5.0,
            "limit_seconds": 4.0, "stack": [frame], "seq": 90, "last_entered": None, "last_completed": None,
            "error": None, "nics": {}, "peers": {}}
