"""Diagnosing one window, in a worker process (the engine's memory and any native crash stay there).

The window's documents and those of the job's earlier windows (its history: a setting a rank had
while the job was healthy cannot explain a later slowdown) are written as packed files to a
temporary run directory and diagnosed as `eroica diagnose` would; the window's own diagnosis comes
back as JSON text. The directories are named by the worker (`w<n>-s0`, in step order), never from
request data, and the window's own id is put back into the result.

A worker that dies (an OOM kill, a native crash) or a diagnosis that runs past its time does not
stop the service: the pool is rebuilt and the caller decides what becomes of the window.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from eroica.collector.gather import PACKED_NAME


class DiagnosisTimeout(Exception):
    """The worker did not answer in time: it was ended, and the pool rebuilt."""


class WorkerDied(Exception):
    """The worker process died under the diagnosis (killed, out of memory, a native crash)."""


def diagnose_window(window_id: str, docs: list[bytes], history: list[list[bytes]], knowledge_dirs: list[str]) -> str:
    """The eroica.diagnosis/v1 JSON of the window of `docs` alone, named `window_id` (the earlier
    windows of `history`, oldest first, inform it and are not reported)."""
    from eroica.engine.diagnose import DiagnoseOptions, diagnose

    with tempfile.TemporaryDirectory(prefix="eroica-serve-") as tmp:
        names = [f"w{i:06d}-s0" for i in range(len(history) + 1)]
        for name, ds in zip(names, [*history, docs]):
            (Path(tmp) / name).mkdir()
            (Path(tmp) / name / PACKED_NAME).write_bytes(b"".join(d.rstrip(b"\n") + b"\n" for d in ds))
        d = diagnose(Path(tmp), DiagnoseOptions(in_process=True, knowledge_dirs=[Path(k) for k in knowledge_dirs]))
    mine = [w.model_copy(update={"window": window_id}) for w in d.windows if w.window == names[-1]]
    return d.model_copy(update={"windows": mine, "run_dir": window_id}).model_dump_json(by_alias=True)


class Diagnoser:
    """A pool of worker processes (spawned: the service's threads are not forked into them)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.restarts = 0
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))

    def run(self, window_id: str, docs: list[bytes], history: list[list[bytes]], knowledge_dirs: list[str],
            timeout: float) -> str:
        """The diagnosis's JSON; WorkerDied or DiagnosisTimeout (the pool rebuilt either way), or the
        engine's own exception."""
        try:
            fut = self.pool.submit(diagnose_window, window_id, docs, history, knowledge_dirs)
        except (BrokenProcessPool, RuntimeError):       # it broke between two windows: rebuild and go on
            self.restart()
            fut = self.pool.submit(diagnose_window, window_id, docs, history, knowledge_dirs)
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
