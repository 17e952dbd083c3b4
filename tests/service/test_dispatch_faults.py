"""The diagnosis path under real faults: its worker process killed (as the OOM killer would) once or
every time, stopped (a hung diagnosis), or the database refusing the result. Before, one dead worker
sent every later window to `failed` for good and a hung one stalled the replica's only dispatch
thread; now the pool is rebuilt, the window put back with a capped attempt count, and a window that
failed for good says why."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from polling import until
from service_support import incident_docs

from eroica.service.app import Service, Settings
from eroica.service.db import windows


def rows(svc: Service) -> list[Any]:
    with svc.eng.connect() as c:
        return list(c.execute(sa.select(windows.c.job_id, windows.c.status, windows.c.attempts, windows.c.error,
                                        windows.c.claimed_by, windows.c.lease_until).order_by(windows.c.pk)))


def service(tmp: Path, **kw: Any) -> Service:
    svc = Service(Settings(db_url=f"sqlite:///{tmp / 'f.db'}", poll_seconds=0.05, grace_seconds=1, **kw))
    return svc


def add_window(svc: Service, job: str) -> None:
    for d in incident_docs("INC-0017"):
        svc.accept(job, d, "test")


class Killer:
    """Sends `sig` to each diagnosis worker process (up to `times` of them) as soon as it has a window:
    handed to the pool while the new worker is still warming up (importing the engine, compiling the
    knowledge), so the signal always lands before the diagnosis can finish. A worker killed before
    it has a window costs no window an attempt (the pool is rebuilt at the next submission); this
    kills the one that has it."""

    def __init__(self, svc: Service, sig: int, times: int, after: float = 0.0) -> None:
        self.svc, self.sig, self.times, self.after = svc, sig, times, after
        self.hit: list[int] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.hit) < self.times:
            d = self.svc.diagnoser
            for pid in d.pids() if d is not None and d.in_flight is not None else []:
                if pid not in self.hit:
                    time.sleep(self.after)
                    try:
                        os.kill(pid, self.sig)
                        self.hit.append(pid)
                    except ProcessLookupError:
                        pass
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


def test_a_killed_worker_is_replaced_and_the_window_diagnosed_on_its_next_attempt(tmp_path: Path) -> None:
    svc = service(tmp_path)
    add_window(svc, "job-1")
    svc.start()
    killer = Killer(svc, signal.SIGKILL, times=1)
    try:
        until(lambda: killer.hit)
        (w,) = until(lambda: [r for r in rows(svc) if r.status == "done"])
        assert w.attempts == 2 and svc.diagnoser is not None and svc.diagnoser.restarts >= 1
        add_window(svc, "job-2")                                   # and every later window still goes through
        until(lambda: [r.status for r in rows(svc)] == ["done", "done"])
        assert rows(svc)[1].attempts == 1
    finally:
        killer.stop()
        svc.stop()


def test_a_window_that_kills_its_worker_every_time_fails_for_good_with_its_reason(tmp_path: Path) -> None:
    svc = service(tmp_path, max_attempts=3)
    add_window(svc, "job-1")
    svc.start()
    killer = Killer(svc, signal.SIGKILL, times=3)
    try:
        (w,) = until(lambda: [r for r in rows(svc) if r.status == "failed"], 180)
        assert w.attempts == 3 and "failed for good after 3 attempt(s)" in w.error and "WorkerDied" in w.error
        assert (w.claimed_by, w.lease_until) == (None, None)
        killer.stop()
        add_window(svc, "job-2")
        until(lambda: rows(svc)[-1].status == "done")               # the replica is not taken down with it
    finally:
        killer.stop()
        svc.stop()


def test_a_hung_diagnosis_is_ended_at_its_timeout_and_the_dispatch_goes_on(tmp_path: Path) -> None:
    svc = service(tmp_path, diagnosis_timeout_seconds=20.0)
    add_window(svc, "job-1")
    svc.start()
    killer = Killer(svc, signal.SIGSTOP, times=1)      # stopped: alive, never answers
    try:
        until(lambda: killer.hit)
        (w,) = until(lambda: [r for r in rows(svc) if r.status == "done"], 180)
        assert w.attempts == 2
        stopped = killer.hit[0]
        assert not Path(f"/proc/{stopped}").exists() or "zombie" in Path(f"/proc/{stopped}/status").read_text()
    finally:
        killer.stop()
        svc.stop()


def test_a_result_the_database_refuses_puts_the_window_back_then_fails_it_with_the_reason(tmp_path: Path) -> None:
    svc = service(tmp_path, max_attempts=2)
    with svc.eng.begin() as c:
        c.exec_driver_sql("CREATE TRIGGER refuse BEFORE INSERT ON diagnoses BEGIN "
                          "SELECT RAISE(ABORT, 'the disk says no'); END")
    add_window(svc, "job-1")
    svc.start()
    try:
        (w,) = until(lambda: [r for r in rows(svc) if r.status == "failed"])
        assert w.attempts == 2 and "the disk says no" in w.error and w.lease_until is None
        time.sleep(0.5)
        assert rows(svc)[0].status == "failed"                   # not re-claimed every lease period, forever
        with svc.eng.begin() as c:
            c.exec_driver_sql("DROP TRIGGER refuse")
        doc = incident_docs("INC-0017")[0]
        assert not svc.accept("job-1", doc, "test").created      # a re-upload changes nothing
    finally:
        svc.stop()
