"""Diagnosing one window, in a worker process (the engine's memory and any native crash stay there).

The window's documents go to the engine as documents (eroica.engine.diagnose.diagnose_documents),
with the job's history as the stored summaries of its earlier windows (eroica.schema.diagnosis
`WindowHistory`): nothing is written to disk, no earlier window's documents are read again, and a
job's k-th window costs what its first did. The window's diagnosis, which carries its own summary
for the windows after it, comes back as JSON text.

A worker that dies (an OOM kill, a native crash) or a diagnosis that runs past its time does not
stop the service: the pool is rebuilt and the caller decides what becomes of the window.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path


class DiagnosisTimeout(Exception):
    """The worker did not answer in time: it was ended, and the pool rebuilt."""


class WorkerDied(Exception):
    """The worker process died under the diagnosis (killed, out of memory, a native crash)."""


def diagnose_window(window_id: str, packs: list[bytes], refs: list[tuple[int, int]] | None, history: list[str],
                    knowledge_dirs: list[str], parse_processes: int = 1) -> str:
    """The eroica.diagnosis/v1 JSON of the window of the documents in `packs` (gzip'd or not, one
    document per line; `refs`: the (pack, line) of each, or None for every line), named `window_id`;
    `history`: the `WindowHistory` JSON of the job's earlier windows; `parse_processes`: how many
    processes parse a wide window's documents (forked from this worker, for this window only)."""
    from eroica.engine.diagnose import DiagnoseOptions, diagnose_documents
    from eroica.engine.load import window_of_packs
    from eroica.schema.diagnosis import WindowHistory

    d = diagnose_documents([window_of_packs(window_id, packs, refs, workers=parse_processes)],
                           history=[WindowHistory.model_validate_json(h) for h in history],
                           opts=DiagnoseOptions(in_process=True, knowledge_dirs=[Path(k) for k in knowledge_dirs]),
                           run=window_id)
    return d.model_dump_json(by_alias=True)


class Diagnoser:
    """A pool of worker processes (spawned: the service's threads are not forked into them)."""

    def __init__(self, workers: int = 1, parse_processes: int = 1) -> None:
        self.workers = workers
        self.parse_processes = parse_processes
        self.restarts = 0
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))

    def run(self, window_id: str, packs: list[bytes], refs: list[tuple[int, int]] | None, history: list[str],
            knowledge_dirs: list[str], timeout: float) -> str:
        """The diagnosis's JSON; WorkerDied or DiagnosisTimeout (the pool rebuilt either way), or the
        engine's own exception."""
        args = (window_id, packs, refs, history, knowledge_dirs, self.parse_processes)
        try:
            fut = self.pool.submit(diagnose_window, *args)
        except (BrokenProcessPool, RuntimeError):       # it broke between two windows: rebuild and go on
            self.restart()
            fut = self.pool.submit(diagnose_window, *args)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.restart()
            raise DiagnosisTimeout(f"no diagnosis after {timeout:.0f} s: the worker was ended") from None
        except BrokenProcessPool as exc:
            self.restart()
            raise WorkerDied(f"the diagnosis worker died ({exc}); a new one was started") from None

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
