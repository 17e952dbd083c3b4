"""One replica in several HTTP processes (`eroica serve --http-processes N`): uploads from many
clients land in every process, each document is stored once, the window is diagnosed once (only the
first process dispatches), the counters a scrape shows are the sum over the processes, SQLite's
writers take turns across processes without a refusal, and the extra processes end with the
replica, even when it is killed."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import signal
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from load_support import TOKEN, Replica
from polling import until
from service_support import PG, PG_WHY, database

from eroica.lab.simulate import simulate

RANKS = 256


def host_bodies(tmp: Path) -> list[bytes]:
    simulate(tmp / "sim", RANKS, "gpu_throttled", seed=3, tp=8, pp=4, packed=True)
    return [gzip.compress(f.read_bytes(), 1) for f in sorted((tmp / "sim").rglob("host-*.jsonl"))]


def post(url: str, body: bytes) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v1/patterns", body=body, headers={
            "Authorization": f"Bearer {TOKEN}", "X-Eroica-Job": "wide", "Content-Encoding": "gzip",
            "Content-Type": "application/x-ndjson"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def http_processes(rep: Replica) -> list[psutil.Process]:
    """The replica and its forked HTTP processes (not its spawned diagnosis workers). A worker being
    spawned is, until its exec, a fork with the replica's command line: the children are read until
    two reads 0.3 s apart name the same ones (10 s at most)."""
    main = psutil.Process(rep.proc.pid)

    def forked() -> dict[int, psutil.Process]:
        out = {}
        for c in main.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if "multiprocessing" not in " ".join(c.cmdline()):
                    out[c.pid] = c
        return out

    last: dict[int, psutil.Process] = {}

    def settled() -> list[psutil.Process] | None:
        nonlocal last
        before, last = last, forked()
        return [main, *last.values()] if before and last.keys() == before.keys() else None

    last = forked()
    return until(settled, timeout=10, what="the replica's forked HTTP processes settle", every=0.3)


WITH_PG = pytest.param("postgresql", marks=pytest.mark.skipif(not PG, reason=PG_WHY))


@pytest.mark.parametrize("kind", ["sqlite", WITH_PG])
def test_three_http_processes_store_every_upload_once_and_diagnose_the_window_once(tmp_path: Path, kind: str) -> None:
    bodies = host_bodies(tmp_path)
    with database(kind, tmp_path) as db:
        rep = Replica(tmp_path, db, "r", extra=["--http-processes", "3"]).start()
        try:
            procs = http_processes(rep)
            assert len(procs) == 3
            cpu0 = {p.pid: sum(p.cpu_times()[:2]) for p in procs}
            with ThreadPoolExecutor(8) as ex:
                codes = list(ex.map(lambda b: post(rep.url, b), bodies))
            assert codes == [201] * len(bodies)                         # no 503: SQLite's writers took turns
            busy = [sum(p.cpu_times()[:2]) - cpu0[p.pid] for p in procs]
            assert sum(b > 0.05 for b in busy) >= 2, busy               # the uploads were shared out
            deadline = time.time() + 120
            while True:
                job = json.loads(urllib.request.urlopen(f"{rep.url}/v1/jobs/wide", timeout=10).read())
                (w,) = job["windows"]
                if w["status"] == "done" or time.time() > deadline:
                    break
                time.sleep(0.3)
            assert (w["status"], w["ranks_reported"], w["diagnoses_stored"]) == ("done", RANKS, 1)
            # every scrape, whichever process answers it, counts every process's documents
            for _ in range(6):
                text = urllib.request.urlopen(f"{rep.url}/metrics", timeout=10).read().decode()
                (line,) = [ln for ln in text.splitlines() if ln.startswith("eroica_documents_ingested_total")]
                assert float(line.split()[1]) == RANKS
            assert post(rep.url, bodies[0]) == 200                        # the same upload again: nothing new
        finally:
            rep.stop()
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)


def test_the_extra_http_processes_die_with_a_killed_replica(tmp_path: Path) -> None:
    rep = Replica(tmp_path, f"sqlite:///{tmp_path / 'k.db'}", "k", extra=["--http-processes", "2"]).start()
    try:
        (_, extra) = http_processes(rep)
        os.kill(rep.proc.pid, signal.SIGKILL)                         # no chance to end them itself
        rep.proc.wait(10)
        extra.wait(15)                                                # PR_SET_PDEATHSIG ended it
    finally:
        rep.stop()


def test_http_processes_must_be_at_least_one(tmp_path: Path) -> None:
    import subprocess

    eroica = str(Path(sys.executable).parent / "eroica")
    r = subprocess.run([eroica, "serve", "--data", str(tmp_path), "--http-processes", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--http-processes must be at least 1" in r.stderr
