"""`--watch` on a shared run root with many old runs: new files arrive through inotify (watchdog)
within a moment, the tree is walked only by the slow reconcile, so an idle root costs the service
next to nothing; a file inotify missed is found by the reconcile; and what a job's sink spooled
(the service was unreachable, then the job exited) is ingested to its routes and removed."""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import sqlalchemy as sa
from polling import until
from service_support import incident_docs

from eroica.service.app import Service, Settings
from eroica.service.db import jobs, steps, windows
from eroica.service.watch import Watcher


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


def ranks_of(svc: Service, job: str) -> int:
    with svc.eng.connect() as c:
        return int(c.execute(sa.select(sa.func.coalesce(sa.func.sum(windows.c.ranks_reported), 0))
                             .where(windows.c.job_id == job)).scalar())


@contextlib.contextmanager
def watching(svc: Service, root: Path) -> Iterator[tuple[Watcher, threading.Thread]]:
    watcher = Watcher(svc, [root], reconcile_seconds=300)
    stop = threading.Event()
    t = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    t.start()
    try:
        yield watcher, t
    finally:
        stop.set()
        t.join(10)
        svc.stop()


def jobs_known(svc: Service) -> int:
    with svc.eng.connect() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(jobs)).scalar())


def thread_cpu(t: threading.Thread) -> float:
    for th in psutil.Process().threads():
        if th.id == t.native_id:
            return float(th.user_time + th.system_time)
    return 0.0


def test_new_files_arrive_through_inotify_and_an_idle_root_of_many_runs_costs_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    doc = incident_docs("INC-0017")[0]
    for i in range(800):                                 # months of old runs, each with a window
        write_atomic(root / f"old-{i:04d}" / "w000-s10" / "rank-0.json", doc)
    svc = Service(Settings(db_url=f"sqlite:///{tmp_path / 'w.db'}"))
    with watching(svc, root) as (watcher, t):
        until(lambda: watcher.scans == 1 and jobs_known(svc) == 800, 180)       # the first reconcile
        cpu0 = thread_cpu(t)
        time.sleep(3.0)                                    # idle: before, a full rglob of the tree every second
        idle = thread_cpu(t) - cpu0
        t0 = time.perf_counter()
        for r, d in enumerate(incident_docs("INC-0017")):
            write_atomic(root / "new-run" / "w001-s50" / f"rank-{r}.json", d)
        until(lambda: ranks_of(svc, "new-run") == 4)
        seen_after = time.perf_counter() - t0
        assert watcher.scans == 1                         # found by inotify, not by walking the tree
        assert seen_after < 5.0, seen_after
        assert idle < 0.15, f"{idle:.3f} s of CPU in 3 s idle"
        # a file inotify never told of (written while the service looked away) is found by the reconcile
        watcher.seen.clear()
        assert watcher.scan() == 0                         # nothing new; all idempotent


def test_what_a_sink_spooled_is_ingested_to_its_routes_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    spool = root / "job-a" / ".spool" / "rank-0"
    write_atomic(spool / "meta.json", json.dumps({"job_id": "llm.run-1", "job_name": "llm",
                                                  "url": "http://down:8080"}).encode())
    items = [("patterns", d) for d in incident_docs("INC-0017")]
    items.append(("steps", json.dumps({"first_step": 0, "last_step": 19, "median_seconds": 0.1, "p90_seconds": 0.12,
                                       "world_size": 4}).encode()))
    items.append(("end", b"{}"))
    for i, (kind, body) in enumerate(items):
        write_atomic(spool / f"{1000 + i:020d}-{i:06d}-{kind}.json.gz", gzip.compress(body))
    svc = Service(Settings(db_url=f"sqlite:///{tmp_path / 's.db'}"))
    with watching(svc, root) as (watcher, _):
        until(lambda: not list(spool.glob("*.json.gz")))
        assert ranks_of(svc, "llm.run-1") == 4
        with svc.eng.connect() as c:
            job = c.execute(sa.select(jobs.c.name, jobs.c.ended_by).where(jobs.c.id == "llm.run-1")).one()
            n_steps = c.execute(sa.select(sa.func.count()).select_from(steps)).scalar()
        assert tuple(job) == ("llm", "job") and n_steps == 1
        # a spool that appears later (another rank's, written as its job exits) comes through inotify
        later = root / "job-a" / ".spool" / "rank-1"
        write_atomic(later / "meta.json", json.dumps({"job_id": "llm.run-1", "job_name": "llm"}).encode())
        write_atomic(later / f"{5000:020d}-{0:06d}-steps.json.gz", gzip.compress(json.dumps(
            {"first_step": 20, "last_step": 39, "median_seconds": 0.1, "p90_seconds": 0.12, "world_size": 4}).encode()))
        until(lambda: not list(later.glob("*.json.gz")))
        assert watcher.scans == 1


def test_a_kept_raw_trace_beside_the_documents_and_a_spooled_one_are_stored_for_the_job(tmp_path: Path) -> None:
    from eroica.schema.raw_trace import RawTraceHeader, pack
    from eroica.service.db import traces_of

    root = tmp_path / "runs"
    docs = incident_docs("INC-0017")
    wid = json.loads(docs[0])["window"]["window_id"]
    trace = {"traceEvents": [{"name": "DataLoader.__next__", "ph": "X", "ts": 1, "dur": 5, "pid": 1, "tid": 1}]}
    # the trace lands first: its job is not known yet, so a later look takes it (here the documents')
    write_atomic(root / "job-t" / wid / "rank-2.trace.json", json.dumps(trace).encode())
    svc = Service(Settings(db_url=f"sqlite:///{tmp_path / 't.db'}"))
    with watching(svc, root) as (watcher, _):
        for r, d in enumerate(docs):
            write_atomic(root / "job-t" / wid / f"rank-{r}.json", d)
        until(lambda: ranks_of(svc, "job-t") == len(docs))
        assert watcher.scan() == 0
        spool = root / "job-t" / ".spool" / "rank-3"
        write_atomic(spool / "meta.json", json.dumps({"job_id": "job-t"}).encode())
        write_atomic(spool / f"{1000:020d}-{0:06d}-traces.json.gz", gzip.compress(pack(
            RawTraceHeader(window_id=wid, rank=3, world_size=len(docs), host="node-3"), json.dumps(trace).encode())))
        until(lambda: not list(spool.glob("*.json.gz")))
        with svc.eng.connect() as c:
            kept = traces_of(c, "job-t")
    assert [(t["rank"], t["host"]) for t in kept[wid]] == [(2, None), (3, "node-3")]
