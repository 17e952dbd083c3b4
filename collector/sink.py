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
import time
import urllib.error
import urllib.request
from pathlib import Path

from eroica.collector.writer import QueueThread

ENV = "EROICA_SINK"
SERIES_EVERY = 20       # steps per summary of the always-on step-time series (rank 0)
TOKEN_ENV = "EROICA_SINK_TOKEN"


def post_with_retry(req: urllib.request.Request, attempts: int, timeout: float, name: str) -> str | None:
    """POST `req`, retried with backoff (0.5 s, doubling); None when it was taken, else why. A refusal
    (4xx other than 408/429) is final and says `refused:` (retrying would only repeat it)."""
    delay = 0.5
    why = ""
    for i in range(attempts):
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
            return None
        except urllib.error.HTTPError as exc:
            with exc:      # its response holds a socket
                why = f"{name}: HTTP {exc.code} {exc.read()[:200]!r}"
            if exc.code < 500 and exc.code not in (408, 429):
                return "refused: " + why
        except (OSError, urllib.error.URLError) as exc:
            why = f"{name}: {exc!r}"
        if i + 1 < attempts:
            time.sleep(delay)
            delay *= 2
    return why


class PatternSink(QueueThread):
    def __init__(self, url: str, job_id: str, spool_dir: Path, token: str | None = None, max_pending: int = 8,
                 attempts: int = 3, timeout_seconds: float = 5.0, spool_max_files: int = 256,
                 job_name: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.job_name = job_name
        self.job_id, self.spool, self.token = job_id, Path(spool_dir), token
        self.attempts, self.timeout, self.spool_max = attempts, timeout_seconds, spool_max_files
        self.sent = 0
        self._series: list[float] = []      # step times since the last summary
        self._series_first = 0
        super().__init__("eroica-sink", max_pending)

    def step_seen(self, done: int, seconds: float, world_size: int) -> None:
        """Rank 0's step times: every SERIES_EVERY steps, their median and p90 (the series the service plots)."""
        if not self._series:
            self._series_first = done
        self._series.append(seconds)
        if len(self._series) >= SERIES_EVERY:
            s = sorted(self._series)
            self.submit_steps(self._series_first, done, s[len(s) // 2], s[min(len(s) - 1, int(0.9 * len(s)))],
                              world_size)
            self._series = []

    def submit(self, text: str) -> bool:
        """Queue a pattern document; False (nothing queued) when the queue is full."""
        return self._put(("/v1/patterns", text.encode()))

    def submit_steps(self, first: int, last: int, median: float, p90: float, world_size: int) -> bool:
        """Queue one summary of the always-on step-time series."""
        body = json.dumps({"first_step": first, "last_step": last, "median_seconds": median, "p90_seconds": p90,
                           "world_size": world_size}).encode()
        return self._put((f"/v1/jobs/{self.job_id}/steps", body))

    def submit_hang(self, text: str) -> bool:
        """Queue a hang snapshot (the watchdog's): the service localizes the hang while the job waits."""
        return self._put((f"/v1/jobs/{self.job_id}/hang", text.encode()))

    def submit_end(self) -> bool:
        """Queue the run's end (rank 0, at close): the service resolves the alerts of its open issues."""
        return self._put((f"/v1/jobs/{self.job_id}/end", b"{}"))

    def messages(self) -> list[str]:
        """What failed since the last call, in words."""
        return [str(exc) for _, exc in self.errors()]

    def _note(self, msg: str) -> None:
        self._error("sink", ConnectionError(msg[:300]))

    def _post(self, path: str, body: bytes) -> str | None:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "X-Eroica-Job": self.job_id}
        if self.job_name:
            headers["X-Eroica-Job-Name"] = self.job_name
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=gzip.compress(body, 1), headers=headers, method="POST")
        return post_with_retry(req, self.attempts, self.timeout, f"{self.url}{path}")

    def _spool(self, path: str, body: bytes) -> None:
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            if len(list(self.spool.glob("*.json.gz"))) >= self.spool_max:
                self._note(f"spool {self.spool} full ({self.spool_max} files): a document was dropped")
                return
            name = f"{time.time_ns()}-{path.rsplit('/', 1)[-1]}.json.gz"     # patterns, steps or end
            tmp = self.spool / f".{name}.tmp"
            tmp.write_bytes(gzip.compress(body, 1))
            tmp.replace(self.spool / name)
        except OSError as exc:
            self._note(f"spool {self.spool}: {exc!r}")

    def _drain_spool(self) -> None:
        with contextlib.suppress(OSError):
            for f in sorted(self.spool.glob("*.json.gz")):
                kind = f.name.removesuffix(".json.gz").rsplit("-", 1)[-1]
                path = f"/v1/jobs/{self.job_id}/{kind}" if kind in ("steps", "end") else "/v1/patterns"
                why = self._post(path, gzip.decompress(f.read_bytes()))
                if why is not None and not why.startswith("refused"):
                    return          # the service is down again: keep the rest for later
                if why is not None:
                    self._note(why)
                f.unlink()
                self.sent += why is None

    def _handle(self, item: tuple[str, bytes]) -> None:
        path, body = item
        why = self._post(path, body)
        if why is None:
            self.sent += 1
            self._drain_spool()
        elif why.startswith("refused"):
            self._note(why)
        else:
            self._note(why + "; spooled")
            self._spool(path, body)
