"""Several replicas on one database diagnose each window exactly once; a replica that dies with a
window claimed leaves it to another once its lease expires; a service killed with -9 in the middle
of ingestion loses nothing it acknowledged, and the window completes when its last ranks arrive."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from service_support import PG, PG_WHY, TOKEN, database, free_port, incident_docs, postgres

from eroica.service import store
from eroica.service.app import Service, Settings
from eroica.service.db import diagnoses, windows

WITH_PG = pytest.param("postgresql", marks=pytest.mark.skipif(not PG, reason=PG_WHY))


@pytest.mark.parametrize("kind", ["sqlite", WITH_PG])
def test_two_replicas_diagnose_every_window_exactly_once(tmp_path: Path, kind: str) -> None:
    with database(kind, tmp_path) as url:
        a = Service(Settings(db_url=url, poll_seconds=0.05, name="replica-a"))
        b = Service(Settings(db_url=url, poll_seconds=0.05, name="replica-b"))
        docs = incident_docs("INC-0017")
        for j in range(6):
            for d in docs:
                a.accept(f"job-{j}", d, "test")
        a.start()
        b.start()
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                with a.eng.connect() as c:
                    st = c.execute(sa.select(windows.c.status, windows.c.attempts, windows.c.claimed_by)).all()
                if all(s.status == "done" for s in st):
                    break
                time.sleep(0.2)
            assert [s.status for s in st] == ["done"] * 6, st
            assert [s.attempts for s in st] == [1] * 6           # nobody diagnosed a window twice
            with a.eng.connect() as c:
                assert c.execute(sa.select(sa.func.count()).select_from(diagnoses)).scalar() == 6
        finally:
            a.stop()
            b.stop()


def test_a_window_claimed_by_a_replica_that_died_goes_to_another_when_its_lease_expires(tmp_path: Path) -> None:
    svc = Service(Settings(db_url=f"sqlite:///{tmp_path / 'l.db'}", name="alive"))
    for d in incident_docs("INC-0017"):
        svc.accept("job", d, "test")
    now = time.time()
    store.mark_ready(svc.eng, 30, now)
    assert store.claim(svc.eng, "dead", now) is not None          # then the replica dies
    assert store.claim(svc.eng, "alive", now + 1) is None          # its lease still holds
    pk = store.claim(svc.eng, "alive", now + store.LEASE_SECONDS + 1)
    assert pk is not None
    with svc.eng.connect() as c:
        assert c.execute(sa.select(windows.c.claimed_by, windows.c.attempts)).one() == ("alive", 2)
    svc.eng.dispose()


def _post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url + "/v1/patterns", data=gzip.compress(body), method="POST", headers={
        "Authorization": f"Bearer {TOKEN}", "X-Eroica-Job": "killed", "Content-Encoding": "gzip",
        "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


def _start(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    (tmp / "token").write_text(TOKEN)
    p = subprocess.Popen([str(Path(sys.executable).parent / "eroica"), "serve", "--data", str(tmp / "data"), "--port",
                          str(port), "--token-file", str(tmp / "token"), "--grace-seconds", "600"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return p
        time.sleep(0.2)
    raise AssertionError("eroica serve did not start")


def test_kill_9_in_the_middle_of_ingestion_loses_nothing_acknowledged(tmp_path: Path) -> None:
    docs = incident_docs("INC-0017")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = _start(tmp_path, port)
    stop = threading.Event()
    try:
        assert [_post(url, d) for d in docs[:2]] == [201, 201]
        # a burst of re-uploads in flight while it dies
        burst = threading.Thread(target=lambda: [_try(url, docs[0]) for _ in range(50) if not stop.is_set()])
        burst.start()
        time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        stop.set()
        burst.join(20)
        p = _start(tmp_path, port)
        job = _get(url + "/v1/jobs/killed")
        assert job["windows"][0]["ranks_reported"] == 2 and job["windows"][0]["status"] == "collecting"
        assert [_post(url, d) for d in docs[2:]] == [201, 201]
        deadline = time.time() + 60
        while time.time() < deadline:
            w = _get(url + "/v1/jobs/killed")["windows"][0]
            if w["status"] == "done":
                break
            time.sleep(0.2)
        assert (w["status"], w["ranks_reported"], w["attempts"]) == ("done", 4, 1)
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        p.wait(20)


def _try(url: str, body: bytes) -> None:
    with contextlib.suppress(OSError):
        _post(url, body)


def _get(url: str) -> dict:  # type: ignore[type-arg]
    import json

    return dict(json.loads(urllib.request.urlopen(url, timeout=5).read()))


@pytest.mark.parametrize("kind", ["sqlite", WITH_PG])
def test_simultaneous_first_documents_of_a_job_neither_fail_nor_lose_a_host(tmp_path: Path, kind: str) -> None:
    """Every rank's first document at once, on one replica's threads and another's: before, the run's
    and the window's rows were created by whoever got there first and the others failed (a 500), and
    the hosts list was read, changed and written back (one host lost)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from eroica.service.db import hosts_of, jobs

    with database(kind, tmp_path) as url:
        a = Service(Settings(db_url=url, name="replica-a"))
        b = Service(Settings(db_url=url, name="replica-b"))
        docs = []
        for r, d in enumerate(incident_docs("INC-0017")):
            doc = json.loads(d)
            doc["job"]["hostname"] = f"node-{r}"
            docs.append(json.dumps(doc).encode())
        try:
            for round_ in range(3):
                barrier = threading.Barrier(8)

                def send(i: int, job: str = f"race-{round_}") -> bool:
                    barrier.wait()
                    return (a if i % 2 else b).accept(job, docs[i % 4], "test").created

                with ThreadPoolExecutor(8) as pool:
                    created = list(pool.map(send, range(8)))
                assert sorted(created) == [False] * 4 + [True] * 4        # each rank stored once, the rest a no-op
            with a.eng.connect() as c:
                ids = list(c.execute(sa.select(jobs.c.id).order_by(jobs.c.id)).scalars())
                got = list(hosts_of(c, ids).items())
                reported = list(c.execute(sa.select(windows.c.ranks_reported)).scalars())
            assert [(j, sorted(h)) for j, h in got] == [(f"race-{i}", [f"node-{r}" for r in range(4)])
                                                        for i in range(3)]
            assert reported == [4, 4, 4]
        finally:
            a.stop()
            b.stop()


@pytest.mark.skipif(not PG, reason=PG_WHY)
def test_replicas_starting_together_on_a_new_database_migrate_once() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from eroica.service.db import revision

    with postgres() as url:
        barrier = threading.Barrier(4)

        def start(i: int) -> Service:
            barrier.wait()
            return Service(Settings(db_url=url, name=f"replica-{i}"))

        with ThreadPoolExecutor(4) as pool:
            svcs = list(pool.map(start, range(4)))          # before: DuplicateTable for all but one
        assert {revision(s.eng) for s in svcs} == {"0015"}
        for s in svcs:
            s.eng.dispose()
