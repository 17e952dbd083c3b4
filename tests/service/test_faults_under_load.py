"""Faults under load: jobs post their windows, step summaries, hang snapshots and ends through the
collector's own sink to `eroica serve` replicas (real processes) while a fault strikes: a replica
killed with -9 in the middle of a diagnosis, a diagnosis worker killed, PostgreSQL stopped and
started, the SQLite disk full, the link between the jobs and the service cut. After each: nothing
the ranks submitted is lost, no window is diagnosed twice, the service recovered on its own, the
ranks never waited on it (the sink is fail-open), and the spools drained."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from load_support import TOKEN, Replica, all_good, drain_spools, verify, wait_diagnosed
from service_support import PG, PG_WHY, pg_cluster

from eroica.lab.loadgen import Load, LoadSpec
from eroica.service.db import make_engine, windows

SPEC = LoadSpec(jobs=6, ranks=4, windows=5, seconds=24.0, tag="fault")
# what a rank's own thread may pay per submit, whatever the service does: a few ms of its CPU, and
# never a wait on the network (one would be seconds: the sink's timeout); the generator's many ranks
# share one process's GIL, which the wall clock also counts
SUBMIT_CPU_MAX_SECONDS = 0.005
SUBMIT_WALL_MAX_SECONDS = 1.0


def run_load(tmp: Path, url: str, db_url: str, fault: Callable[[Load], Callable[[], None] | None],
             at: float = 0.35, hold: float = 5.0, spec: LoadSpec = SPEC, drain_url: str | None = None
             ) -> tuple[Load, dict[str, Any], str]:
    """The load against `url`; `fault` strikes `at` of the way in, and what it returns (its
    restoration) runs `hold` seconds later. Returns the load, the check against the database, and
    what `eroica ingest spool` said of what was left."""
    load = Load(url, TOKEN, spec, tmp / "runs")
    load.start()
    time.sleep(spec.seconds * at)
    restore = fault(load)
    if restore is not None:
        time.sleep(hold)
        restore()
    assert load.join(spec.seconds * 4 + 120), "the ranks did not finish"
    drained = drain_spools(load, drain_url or url)
    wait_diagnosed(db_url, load, 240)
    return load, verify(db_url, load), drained


def assert_whole(load: Load, v: dict[str, Any]) -> None:
    assert all_good(v), v
    assert max(load.submit_cpu_seconds) < SUBMIT_CPU_MAX_SECONDS, max(load.submit_cpu_seconds)   # never slowed
    assert max(load.submit_seconds) < SUBMIT_WALL_MAX_SECONDS, max(load.submit_seconds)
    assert load.leftover_spools() == []                                                   # the spools drained
    assert not load.refused


@contextlib.contextmanager
def sqlite_replica(tmp: Path, db_dir: Path | None = None) -> Iterator[tuple[Replica, str]]:
    url = f"sqlite:///{(db_dir or tmp) / 'load.db'}"
    rep = Replica(tmp, url, "sqlite").start()
    try:
        yield rep, url
    finally:
        rep.stop()


# ---------------------------------------------------------------- a replica killed mid-diagnosis
@pytest.mark.skipif(not PG, reason=PG_WHY)
def test_kill_9_of_a_replica_in_the_middle_of_a_diagnosis(tmp_path: Path) -> None:
    with pg_cluster() as pg:
        a = Replica(tmp_path, pg.url, "a").start()
        b = Replica(tmp_path, pg.url, "b").start()
        eng = make_engine(pg.url)
        killed: list[str] = []

        def kill_b_mid_diagnosis(_: Load) -> None:
            deadline = time.time() + 60
            while time.time() < deadline:            # b holds a claim and its worker is at it
                with eng.connect() as c:
                    mine = c.execute(sa.select(windows.c.window_id).where(
                        windows.c.status == "claimed", windows.c.claimed_by.like(f"%:{b.proc.pid}"))).first()
                if mine is not None:
                    killed.append(mine.window_id)
                    b.kill9()
                    return None
                time.sleep(0.02)
            raise AssertionError("replica b never claimed a window")

        try:
            load, v, drained = run_load(tmp_path, a.url, pg.url, kill_b_mid_diagnosis, at=0.1)
        finally:
            eng.dispose()
            a.stop()
            b.stop()
        assert killed and v["windows_claimed_more_than_once"] >= 1      # a took over b's window after its lease
        assert_whole(load, v)


# ---------------------------------------------------------------- a diagnosis worker killed
def test_a_diagnosis_worker_killed_under_load(tmp_path: Path) -> None:
    with sqlite_replica(tmp_path) as (rep, url):
        hits: list[int] = []

        def kill_workers(_: Load) -> None:
            deadline = time.time() + 30
            while time.time() < deadline and len(hits) < 2:
                for pid in rep.worker_pids():
                    if pid not in hits:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                            hits.append(pid)
                time.sleep(0.2)
            return None
        load, v, _ = run_load(tmp_path, rep.url, url, kill_workers, at=0.3)
        assert hits
        assert rep.proc.poll() is None                                   # the replica itself went on
    assert_whole(load, v)


# ---------------------------------------------------------------- the database stopped and started
@pytest.mark.skipif(not PG, reason=PG_WHY)
def test_postgresql_stopped_and_started_under_load(tmp_path: Path) -> None:
    with pg_cluster() as pg:
        a = Replica(tmp_path, pg.url, "a").start()
        b = Replica(tmp_path, pg.url, "b").start()

        def outage(_: Load) -> Callable[[], None]:
            pg.stop("fast")
            return pg.start

        try:
            load, v, drained = run_load(tmp_path, a.url, pg.url, outage, hold=6.0)
            healthy = [r.proc.poll() is None for r in (a, b)]
        finally:
            a.stop()
            b.stop()
    assert healthy == [True, True]                                       # both rode it out, no restart
    assert any(not ok for s in load.sinks for _, _, ok in s.latencies)   # the outage did strike the ranks
    assert_whole(load, v)


# ---------------------------------------------------------------- the SQLite disk full
def _mount_tmpfs(d: Path, size: str) -> str | None:
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or "mount failed")


def test_the_sqlite_disk_full_under_load(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "40m")
    if why is not None:
        pytest.skip(f"cannot mount a small tmpfs here to fill ({why}); CI runs as root and can")
    try:
        with sqlite_replica(tmp_path, disk) as (rep, url):
            filler = disk / "filler"

            def fill(_: Load) -> Callable[[], None]:
                with contextlib.suppress(OSError), filler.open("wb") as f:   # its close flushes into the full disk too
                    while True:                                     # until ENOSPC: the disk is full
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                return lambda: filler.unlink()

            load, v, drained = run_load(tmp_path, rep.url, url, fill, hold=6.0)
            assert rep.proc.poll() is None
            log = rep.log.read_text()
        assert "database or disk is full" in log or "disk I/O error" in log, log[-2000:]   # it did strike
        assert_whole(load, v)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ---------------------------------------------------------------- the link cut
def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def service_namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace for the service with a veth link to this one: (namespace, its address,
    this side's interface)."""
    tag = uuid.uuid4().hex[:5]
    ns, here, there = f"eroica-srv-{tag}", f"ers{tag}", f"ert{tag}"
    net = int(tag, 16) % 200 + 20
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"10.98.{net}.1/24", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", f"10.98.{net}.2/24", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ns, f"10.98.{net}.2", here
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_the_link_between_jobs_and_service_cut_and_restored_under_load(tmp_path: Path) -> None:
    from eroica.lab.netns import available

    ok, why = available()
    if not ok or shutil.which("ip") is None:
        pytest.skip(f"no network namespaces here: {why}")
    with service_namespace() as (ns, addr, here):
        url = f"sqlite:///{tmp_path / 'load.db'}"
        rep = Replica(tmp_path, url, "netns", prefix=["ip", "netns", "exec", ns], host=addr).start()

        def cut(_: Load) -> Callable[[], None]:
            _ip("link", "set", here, "down")
            return lambda: _ip("link", "set", here, "up")

        try:
            load, v, drained = run_load(tmp_path, rep.url, url, cut, hold=8.0)
            alive = rep.proc.poll() is None
        finally:
            rep.stop()
    assert alive
    assert any(not ok for s in load.sinks for _, _, ok in s.latencies)     # the cut did strike the ranks
    assert_whole(load, v)
