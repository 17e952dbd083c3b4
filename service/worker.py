"""Diagnosing one window, in a worker process (the engine's memory and any native crash stay there).

The worker reads the window's documents from the database itself (the service's process never holds
them), and they go to the engine as documents (eroica.engine.pipeline.diagnose_documents), the
batches validated at upload as the columns built then, with the job's history as the stored
summaries of its earlier windows (eroica.schema.diagnosis `WindowHistory`): nothing is written to
disk, no earlier window's documents are read again, and a job's k-th window costs what its first
did. The window's diagnosis, which carries its own summary for the windows after it, comes back as
JSON text. A new worker imports the engine and compiles the knowledge before its first window.

A worker that dies (an OOM kill, a native crash) or a diagnosis that runs past its time does not
stop the service: the pool is rebuilt and the caller decides what becomes of the window.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any


class DiagnosisTimeout(Exception):
    """The worker did not answer in time: it was ended, and the pool rebuilt."""


class WorkerDied(Exception):
    """The worker process died under the diagnosis (killed, out of memory, a native crash)."""


def diagnose_window(window_id: str, packs: Sequence[bytes], refs: list[tuple[int, int]] | None,
                    history: list[str], knowledge_dirs: list[str], parse_processes: int = 1,
                    chunks: Mapping[int, bytes] | None = None) -> str:
    """The eroica.diagnosis/v1 JSON of the window of the documents in `packs` (gzip'd or not, one
    document per line; `refs`: the (pack, line) of each, or None for every line), named `window_id`;
    `history`: the `WindowHistory` JSON of the job's earlier windows; `parse_processes`: how many
    processes parse a wide window's documents (forked from this worker, for this window only);
    `chunks`: packs' documents already as columns, by pack index (those are not parsed again)."""
    from eroica.engine import held_off

    with held_off():
        return _diagnose_window(window_id, packs, refs, history, knowledge_dirs, parse_processes, chunks)


def _diagnose_window(window_id: str, packs: Sequence[bytes], refs: list[tuple[int, int]] | None,
                     history: list[str], knowledge_dirs: list[str], parse_processes: int,
                     chunks: Mapping[int, bytes] | None) -> str:
    from eroica.engine import DiagnoseOptions, KnowledgeSpec, diagnose_documents, window_of_packs
    from eroica.schema.diagnosis import WindowHistory

    spec = KnowledgeSpec(tuple(map(Path, knowledge_dirs)))
    d = diagnose_documents([window_of_packs(window_id, packs, refs, workers=parse_processes, chunks=chunks)],
                           history=[WindowHistory.model_validate_json(h) for h in history],
                           opts=DiagnoseOptions(in_process=True, knowledge=spec), run=window_id)
    return d.model_dump_json(by_alias=True)


def diagnose_stored(db_url: str, window_pk: int, window_id: str, history: list[str], knowledge_dirs: list[str],
                    parse_processes: int = 1) -> str:
    """`diagnose_window` of a stored window, its documents read here, in the worker, once: the
    batches' column chunks, the bodies of documents without one, and a chunked batch's body only
    when the engine wants one of its documents in full (eroica.service.docs)."""
    from eroica.engine import held_off
    from eroica.service.db import make_engine, reading
    from eroica.service.docs import StoredPacks, window_packs

    eng = make_engine(db_url)
    try:
        with held_off(), reading(eng) as c:
            wp = window_packs(c, window_pk, with_chunks=True)
    finally:
        eng.dispose()          # no connection is left to the parsers this worker may fork
    return diagnose_window(window_id, StoredPacks(wp.packs, wp.unread, db_url), wp.refs, history, knowledge_dirs,
                           parse_processes, wp.chunks)


def warm(knowledge_dirs: list[str]) -> None:
    """Import the engine and compile the knowledge in a new worker, so its first window does not pay
    it. Knowledge that does not compile is not this call's to report: the window's diagnosis will."""
    # what reading a stored window imports (the store, PostgreSQL's driver, the rule runtime)
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    import eroica.service.docs  # noqa: F401
    from eroica.engine import DiagnoseOptions, KnowledgeSpec, compile_knowledge, freeze_startup, load_rule_runtime

    load_rule_runtime()

    try:
        compile_knowledge(DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(tuple(map(Path, knowledge_dirs)))))
    except Exception:      # noqa: BLE001  (reported by the first diagnosis, with its window)
        pass
    freeze_startup()


class Diagnoser:
    """A pool of worker processes (spawned: the service's threads are not forked into them)."""

    def __init__(self, workers: int = 1, parse_processes: int = 1, knowledge_dirs: list[str] | None = None) -> None:
        self.workers = workers
        self.parse_processes = parse_processes
        self.knowledge_dirs = list(knowledge_dirs or [])
        self.restarts = 0
        self.in_flight: int | None = None      # the window handed to the pool and not yet answered
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        for _ in range(self.workers):      # started now, warm by the first window
            pool.submit(warm, self.knowledge_dirs)
        return pool

    def run(self, db_url: str, window_pk: int, window_id: str, history: list[str], timeout: float) -> str:
        """The diagnosis's JSON of a stored window (`diagnose_stored`, with this pool's knowledge);
        WorkerDied or DiagnosisTimeout (the pool rebuilt either way), or the engine's own exception."""
        args = (db_url, window_pk, window_id, history, self.knowledge_dirs, self.parse_processes)
        self.in_flight = window_pk
        return self._result(diagnose_stored, args, timeout)

    def run_hang(self, db_url: str, job_id: str, timeout: float) -> tuple[int, str | None]:
        """A job's hang verdict as JSON and the snapshots' version it is of (eroica.service.hangs.
        localize_stored), made in the pool as a window's diagnosis is; the same failures."""
        from eroica.service.hangs import localize_stored

        return self._result(localize_stored, (db_url, job_id, self.knowledge_dirs), timeout)

    def _result(self, fn: Any, args: tuple[Any, ...], timeout: float) -> Any:
        try:
            fut = self.pool.submit(fn, *args)
        except (BrokenProcessPool, RuntimeError):       # it broke between two windows: rebuild and go on
            self.restart()
            fut = self.pool.submit(fn, *args)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.restart()
            raise DiagnosisTimeout(f"no diagnosis after {timeout:.0f} s: the worker was ended") from None
        except BrokenProcessPool as exc:
            self.restart()
            raise WorkerDied(f"the diagnosis worker died ({exc}); a new one was started") from None
        finally:
            self.in_flight = None

    def restart(self) -> None:
        """End the pool's processes and start a new pool."""
        self.restarts += 1
        self.close()
        self.pool = self._new_pool()

    def pids(self) -> list[int]:
        return [p.pid for p in list(getattr(self.pool, "_processes", {}).values()) if p.pid is not None]

    def close(self) -> None:
        """Stop at once: queued diagnoses are dropped (their windows stay claimed and go to the next
        replica when the lease ends) and the worker processes are ended, never left behind."""
        procs = list(getattr(self.pool, "_processes", {}).values())   # the pool has no public handle on them
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
