"""What the load benchmark and the fault-under-load tests share: `eroica serve` replicas as real
processes (with their peak memory, worker processes included), and the check of a load against the
database afterwards: every document the ranks submitted stored exactly once, every window diagnosed
exactly once, every step summary, hang snapshot and job end stored."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

from eroica.lab.loadgen import Load
from eroica.service.db import documents, hangs, jobs, make_engine, steps, windows

TOKEN = "load-token-0123456789"


@dataclass
class Replica:
    tmp: Path
    db_url: str
    name: str
    prefix: list[str] = field(default_factory=list)       # e.g. ["ip", "netns", "exec", "srv"]
    host: str = "127.0.0.1"
    port: int = 0
    extra: list[str] = field(default_factory=list)
    peak_rss_bytes: int = 0

    def __post_init__(self) -> None:
        from service_support import free_port

        self.port = self.port or free_port()
        (self.tmp / "token").write_text(TOKEN)
        self.url = f"http://{self.host}:{self.port}"
        self.log = self.tmp / f"{self.name}.log"

    def start(self, timeout: float = 60.0) -> Replica:
        eroica = str(Path(sys.executable).parent / "eroica")
        argv = [*self.prefix, eroica, "serve", "--db", self.db_url, "--host", self.host, "--port", str(self.port),
                "--token-file", str(self.tmp / "token"), "--grace-seconds", "600",
                "--diagnosis-timeout-seconds", "12", *self.extra]
        self._log = self.log.open("a")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                break
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"replica {self.name} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            try:
                p = psutil.Process(self.proc.pid)
                procs = [p, *p.children(recursive=True)]
                rss = sum(q.memory_info().rss for q in procs if q.is_running())
            except psutil.Error:
                continue
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)

    def worker_pids(self) -> list[int]:
        with contextlib.suppress(psutil.Error):
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)
                    if "multiprocessing" in " ".join(c.cmdline()) and "spawn_main" in " ".join(c.cmdline())]
        return []

    def kill9(self) -> None:
        """kill -9 the replica (its diagnosis workers, orphaned, end on their own)."""
        for c in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c.kill()
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def wait_diagnosed(db_url: str, load: Load, timeout: float) -> None:
    """Until every window of the load is done (or the time is up)."""
    eng = make_engine(db_url)
    want = {(j, w) for j, w, _ in load.expected_docs}
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            with eng.connect() as c:
                done = {(r.job_id, r.window_id) for r in c.execute(sa.select(windows.c.job_id, windows.c.window_id)
                                                                   .where(windows.c.status == "done"))}
            if want <= done:
                return
            time.sleep(0.5)
    finally:
        eng.dispose()


def verify(db_url: str, load: Load) -> dict[str, Any]:
    """The load against what the database holds."""
    eng = make_engine(db_url)
    try:
        with eng.connect() as c:
            stored = [(r.job_id, r.window_id, r.rank) for r in c.execute(
                sa.select(windows.c.job_id, windows.c.window_id, documents.c.rank)
                .join(documents, documents.c.window_pk == windows.c.pk))]
            wins = c.execute(sa.select(windows.c.job_id, windows.c.window_id, windows.c.status,
                                       windows.c.diagnoses_stored, windows.c.attempts)).all()
            n_steps = dict(c.execute(sa.select(steps.c.job_id, sa.func.count()).group_by(steps.c.job_id)).all())
            hang_rows = {(r.job_id, r.rank) for r in c.execute(sa.select(hangs.c.job_id, hangs.c.rank))}
            ended = {r.id for r in c.execute(sa.select(jobs.c.id).where(jobs.c.ended_by == "job"))}
    finally:
        eng.dispose()
    ours = {(j, w) for j, w, _ in load.expected_docs}
    mine = [w for w in wins if (w.job_id, w.window_id) in ours]
    return {
        "documents_submitted": len(load.expected_docs),
        "documents_stored": len(set(stored) & load.expected_docs),
        "documents_lost": sorted(load.expected_docs - set(stored))[:10],
        "documents_stored_twice": len(stored) - len(set(stored)),
        "windows": len(ours),
        "windows_done": sum(w.status == "done" for w in mine),
        "windows_diagnosed_twice": [(w.job_id, w.window_id, w.diagnoses_stored) for w in mine
                                    if w.diagnoses_stored > 1],
        "windows_claimed_more_than_once": sum(w.attempts > 1 for w in mine),
        "steps_lost": {j: (n, n_steps.get(j, 0)) for j, n in load.expected_steps.items() if n_steps.get(j, 0) != n},
        "hangs_lost": sorted(load.expected_hangs - hang_rows),
        "ends_lost": sorted({load.job_id(j) for j in range(load.spec.jobs)} - ended),
    }


def all_good(v: dict[str, Any]) -> bool:
    return (v["documents_stored"] == v["documents_submitted"] and not v["documents_stored_twice"]
            and v["windows_done"] == v["windows"] and not v["windows_diagnosed_twice"] and not v["steps_lost"]
            and not v["hangs_lost"] and not v["ends_lost"])


def drain_spools(load: Load, url: str) -> str:
    """What a job left in its spool, sent as its user would after it exited: `eroica ingest spool`."""
    dirs = sorted({str(p.parents[2]) for p in load.leftover_spools()})
    if not dirs:
        return "nothing spooled"
    (load.spool_root / "token").write_text(TOKEN)
    r = subprocess.run([str(Path(sys.executable).parent / "eroica"), "ingest", "spool", *dirs, "--server", url,
                        "--token-file", str(load.spool_root / "token")], capture_output=True, text=True, timeout=300)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
