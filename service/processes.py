"""One replica, several HTTP processes: `eroica serve --http-processes N`.

A host's upload costs the service about 4.5 ms of Python (its gzip, eight documents validated, one
transaction, the HTTP exchange), and a Python process runs one thread at a time: one process takes
at most ~200 host uploads a second however many cores the machine has. With N processes listening
on one socket (the kernel hands each new connection to one of them), uploads and pages are served N
at a time. The first process is the replica's whole self (the dispatch of windows to diagnosis, the
watcher, the alerts); the others only answer requests. They share the database (PostgreSQL, or
SQLite's file, whose writers take turns through `db.writing`), and their counters are summed at
each scrape (Prometheus's multi-process mode: a directory of counter files made for this replica).

Each extra process is forked before the first one builds anything (no thread, engine or socket of
its own is copied), dies with it (PR_SET_PDEATHSIG), and is ended when it ends."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

PR_SET_PDEATHSIG = 1
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def listening_socket(host: str, port: int) -> socket.socket:
    """The replica's socket, bound and listening before any process serves it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@contextlib.contextmanager
def shared_metrics(processes: int) -> Iterator[None]:
    """With several processes, their counters in one directory of this replica's, summed at each
    scrape. Entered before prometheus_client is first imported (it reads the setting then)."""
    if processes <= 1:
        yield
        return
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before the processes' metrics directory was set")
    metrics_dir = tempfile.mkdtemp(prefix="eroica-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def serve(settings: Any, sock: socket.socket, processes: int, run_one: Callable[[Any, socket.socket], None]) -> int:
    """Serve `settings` (an `app.Settings`) on `sock` (`listening_socket`) with `processes` processes;
    `run_one(settings, sock)` serves one process's app on the shared socket until it is told to stop."""
    # uvicorn stops on SIGTERM and then raises it again once with the handler it found: a default
    # handler would end this process there, before it ends and reaps its extra processes
    signal.signal(signal.SIGTERM, _stop_on_term)
    children: list[int] = []
    try:
        for i in range(1, processes):
            pid = os.fork()
            if pid == 0:                             # an extra process: requests only
                code = 0
                try:
                    _die_with_parent()
                    name = f"{settings.name}/http{i}:{os.getpid()}"
                    run_one(dataclasses.replace(settings, background=False, name=name), sock)
                except BaseException as exc:         # noqa: BLE001  (the child must never return into the parent's code)
                    print(f"eroica serve: HTTP process {i} ended: {exc!r}", file=sys.stderr, flush=True)
                    code = 1
                finally:
                    os._exit(code)
            children.append(pid)
        run_one(settings, sock)
        return 0
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        _reap(children, STOP_SECONDS)
        sock.close()


def _stop_on_term(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


STOP_SECONDS = 10.0     # an extra process finishing its requests after SIGTERM; then it is killed


def _reap(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
        if left and time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
