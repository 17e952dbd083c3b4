"""Pattern files are written off the training thread: a slow or hung filesystem (an NFS server
that stalls, a disk that is full) must not stall training.

One background thread writes each document atomically (a temporary file, then a rename; the
temporary file is removed when the write fails). At most `max_pending` documents wait: when the
filesystem cannot keep up, a new window's document is dropped and the Monitor records that, rather
than holding kilobytes without bound or blocking the step. Failures come back as data, never raise.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any


class QueueThread:
    """A bounded queue drained by one daemon thread: `_put` never blocks, failures are kept as data
    (`errors()`), `flush`/`close` wait a bounded time. Subclasses handle one item in `_handle`."""

    def __init__(self, name: str, max_pending: int) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            return False

    def _error(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self._errors.append((where, exc))

    def errors(self) -> list[tuple[str, BaseException]]:
        """(where, exception) of what failed since the last call."""
        if not self._errors:          # asked every step: no lock when there is nothing
            return []
        with self._lock:
            out, self._errors = self._errors, []
        return out

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the queued items; False when some are still pending."""
        deadline = time.monotonic() + timeout
        while self._q.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float) -> bool:
        done = self.flush(timeout)
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)
        if done:
            self._thread.join(1.0)
        return done

    def _handle(self, item: Any) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                self._handle(item)
            except BaseException as exc:   # noqa: BLE001 - reported to the Monitor as data
                self._error(type(self).__name__, exc)
            finally:
                self._q.task_done()


class PatternWriter(QueueThread):
    def __init__(self, max_pending: int = 2) -> None:
        super().__init__("eroica-writer", max_pending)

    def submit(self, path: Path, text: str) -> bool:
        """Queue `text` for `path`; False (nothing queued) when `max_pending` writes already wait."""
        return self._put((path, text))

    def _handle(self, item: tuple[Path, str]) -> None:
        path, text = item
        tmp = path.parent / f".{path.name}.tmp"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, path)
        except BaseException as exc:   # noqa: BLE001 - reported to the Monitor as data
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._error(str(path), exc)
