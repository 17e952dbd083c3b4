"""Shipping pattern documents to `eroica serve` when there is no shared filesystem.

Plain HTTP from a background thread (the collector never imports the service): each document is
POSTed gzip'd to `<sink>/v1/patterns` with the job's id, retried a bounded number of times with
backoff, and spooled to a bounded local directory when the service cannot take it; spooled
documents go first at the next successful send. Like the file writer it is fail-open: a dead or
slow service costs the training thread nothing (a bounded queue, `submit` never blocks) and loses
nothing the spool can hold. Failures come back as data, never raise.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ENV = "EROICA_SINK"
TOKEN_ENV = "EROICA_SINK_TOKEN"


class PatternSink:
    def __init__(self, url: str, job_id: str, spool_dir: Path, token: str | None = None, max_pending: int = 8,
                 attempts: int = 3, timeout_seconds: float = 5.0, spool_max_files: int = 256) -> None:
        self.url = url.rstrip("/")
        self.job_id, self.spool, self.token = job_id, Path(spool_dir), token
        self.attempts, self.timeout, self.spool_max = attempts, timeout_seconds, spool_max_files
        self.sent = 0
        self._q: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=max_pending)
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eroica-sink", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> bool:
        """Queue a pattern document; False (nothing queued) when the queue is full."""
        return self._put("/v1/patterns", text.encode())

    def submit_steps(self, first: int, last: int, median: float, p90: float, world_size: int) -> bool:
        """Queue one summary of the always-on step-time series."""
        body = json.dumps({"first_step": first, "last_step": last, "median_seconds": median, "p90_seconds": p90,
                           "world_size": world_size}).encode()
        return self._put(f"/v1/jobs/{self.job_id}/steps", body)

    def _put(self, path: str, body: bytes) -> bool:
        try:
            self._q.put_nowait((path, body))
            return True
        except queue.Full:
            return False

    def errors(self) -> list[str]:
        if not self._errors:
            return []
        with self._lock:
            out, self._errors = self._errors, []
        return out

    def _error(self, msg: str) -> None:
        with self._lock:
            self._errors.append(msg[:300])

    def flush(self, timeout: float) -> bool:
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

    def _post(self, path: str, body: bytes) -> str | None:
        """None when the service took it; else why (a refusal is final, other failures are retried)."""
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "X-Eroica-Job": self.job_id}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=gzip.compress(body, 1), headers=headers, method="POST")
        delay = 0.5
        why = ""
        for i in range(self.attempts):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    r.read()
                return None
            except urllib.error.HTTPError as exc:
                with exc:      # its response holds a socket
                    why = f"{self.url}{path}: HTTP {exc.code} {exc.read()[:200]!r}"
                if exc.code < 500 and exc.code not in (408, 429):
                    return "refused: " + why
            except (OSError, urllib.error.URLError) as exc:
                why = f"{self.url}{path}: {exc!r}"
            if i + 1 < self.attempts:
                time.sleep(delay)
                delay *= 2
        return why

    def _spool(self, path: str, body: bytes) -> None:
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            if len(list(self.spool.glob("*.json.gz"))) >= self.spool_max:
                self._error(f"spool {self.spool} full ({self.spool_max} files): a document was dropped")
                return
            name = f"{time.time_ns()}-{'steps' if path.endswith('/steps') else 'patterns'}.json.gz"
            tmp = self.spool / f".{name}.tmp"
            tmp.write_bytes(gzip.compress(body, 1))
            tmp.replace(self.spool / name)
        except OSError as exc:
            self._error(f"spool {self.spool}: {exc!r}")

    def _drain_spool(self) -> None:
        with contextlib.suppress(OSError):
            for f in sorted(self.spool.glob("*.json.gz")):
                path = f"/v1/jobs/{self.job_id}/steps" if f.name.endswith("-steps.json.gz") else "/v1/patterns"
                why = self._post(path, gzip.decompress(f.read_bytes()))
                if why is not None and not why.startswith("refused"):
                    return          # the service is down again: keep the rest for later
                if why is not None:
                    self._error(why)
                f.unlink()
                self.sent += why is None

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                path, body = item
                why = self._post(path, body)
                if why is None:
                    self.sent += 1
                    self._drain_spool()
                elif why.startswith("refused"):
                    self._error(why)
                else:
                    self._error(why + "; spooled")
                    self._spool(path, body)
            except BaseException as exc:   # noqa: BLE001 - reported to the Monitor as data
                self._error(repr(exc))
            finally:
                self._q.task_done()
