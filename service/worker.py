"""Diagnosing one window, in a worker process (the engine's memory and any native crash stay there).

The window's documents and those of the job's earlier windows (its history: a setting a rank had
while the job was healthy cannot explain a later slowdown) are written as packed files to a
temporary run directory and diagnosed as `eroica diagnose` would; the window's own diagnosis comes
back as JSON text.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from eroica.collector.gather import PACKED_NAME


def diagnose_window(window_id: str, docs: list[bytes], history: list[tuple[str, list[bytes]]],
                    knowledge_dirs: list[str]) -> str:
    """The eroica.diagnosis/v1 JSON of `window_id` alone (history informs it, is not reported)."""
    from eroica.engine.diagnose import DiagnoseOptions, diagnose

    with tempfile.TemporaryDirectory(prefix="eroica-serve-") as tmp:
        for wid, ds in [*history, (window_id, docs)]:
            (Path(tmp) / wid).mkdir()
            (Path(tmp) / wid / PACKED_NAME).write_bytes(b"".join(d.rstrip(b"\n") + b"\n" for d in ds))
        d = diagnose(Path(tmp), DiagnoseOptions(in_process=True, knowledge_dirs=[Path(k) for k in knowledge_dirs]))
    mine = [w for w in d.windows if w.window == window_id]
    return d.model_copy(update={"windows": mine, "run_dir": window_id}).model_dump_json(by_alias=True)


class Diagnoser:
    """A pool of worker processes (spawned: the service's threads are not forked into them)."""

    def __init__(self, workers: int = 1) -> None:
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, window_id: str, docs: list[bytes], history: list[tuple[str, list[bytes]]],
               knowledge_dirs: list[str]) -> Future[str]:
        return self.pool.submit(diagnose_window, window_id, docs, history, knowledge_dirs)

    def close(self) -> None:
        """Stop at once: queued diagnoses are dropped (their windows stay claimed and go to the next
        replica when the lease ends) and the worker processes are ended, never left behind."""
        procs = list(getattr(self.pool, "_processes", {}).values())   # the pool has no public handle on them
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)
