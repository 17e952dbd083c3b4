"""The Monitor's store round trips, on one background thread: the training thread never waits.

A round trip to the job's torch.distributed store costs about 2 ms on a loaded host (the store's
server thread must be scheduled), and an unreachable store blocks until its timeout. So the
training thread only hands jobs over (poll for a window plan, propose one, read control changes)
and picks the answers up at a later step; window plans are agreed for a step far enough ahead
(`lead_steps >= poll_every_steps + 3`) that every rank has its answer in time. At most one job of
each kind is in flight: a store that does not answer holds one job, never a queue of them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STUCK_SECONDS = 30.0     # a job in flight this long: the store is not answering


@dataclass
class Answer:
    kind: str
    value: Any = None
    error: BaseException | None = None


class StoreWorker:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, Callable[[], Any]] | None] = queue.SimpleQueue()
        self.answered: deque[Answer] = deque()     # answers not yet picked up (the Monitor looks every step)
        self._busy: dict[str, float] = {}          # kind -> when it was handed over
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eroica-store", daemon=True)
        self._thread.start()

    def submit(self, kind: str, job: Callable[[], Any]) -> bool:
        """Hand a job over unless one of its kind is still in flight; False when skipped."""
        with self._lock:
            if kind in self._busy:
                return False
            self._busy[kind] = time.monotonic()
        self._jobs.put((kind, job))
        # no time.sleep(0) here: the worker takes the interpreter at the training thread's next release (torch
        # releases it in every operator), and a forced switch costs the training thread CPU on every poll
        return True

    def answers(self) -> list[Answer]:
        out = []
        while self.answered:
            out.append(self.answered.popleft())
        return out

    def stuck(self) -> list[str]:
        """Kinds of job the store has not answered for STUCK_SECONDS."""
        now = time.monotonic()
        with self._lock:
            return [k for k, t in self._busy.items() if now - t > STUCK_SECONDS]

    def in_flight(self, kind: str) -> bool:
        with self._lock:
            return kind in self._busy

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread; a job stuck in a store that does not answer keeps it (a daemon) alive."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            kind, job = item
            try:
                ans = Answer(kind, value=job())
            except BaseException as exc:   # noqa: BLE001 - every failure goes back to the Monitor as data
                ans = Answer(kind, error=exc)
            with self._lock:
                self._busy.pop(kind, None)
            self.answered.append(ans)
