"""Shipping pattern documents to `eroica serve` when there is no shared filesystem.

Plain HTTP from a background thread (the collector never imports the service): each document is
POSTed gzip'd to `<sink>/v1/patterns` with the job's id, retried a bounded number of times with
backoff, and spooled to a bounded local directory when the service cannot take it. The spool keeps
each item's kind (patterns, steps, hang, end) in its name and the job's id and name in `meta.json`,
so it is replayed to the right route, in the order it was made (a new item waits behind older
spooled ones), by this sink at its next successful send or, after the job exited, by
`eroica ingest spool RUN_DIR` or a service watching the run root. Redirects are never followed:
a 3xx is an error (a POST turned into a GET would lose the document and send the token elsewhere).
Like the file writer it is fail-open: a dead or slow service costs the training thread nothing (a
bounded queue, `submit` never blocks) and loses nothing the spool can hold. Failures come back as
data, never raise.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from eroica.collector.writer import QueueThread

ENV = "EROICA_SINK"
SERIES_EVERY = 20       # steps per summary of the always-on step-time series (rank 0)
TOKEN_ENV = "EROICA_SINK_TOKEN"
KINDS = ("patterns", "steps", "hang", "end")
META = "meta.json"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is answered as an error: never followed (urllib would re-send the Authorization header
    to wherever it points, and turn the POST into a body-less GET)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


OPENER = urllib.request.build_opener(_NoRedirect)


def post_with_retry(req: urllib.request.Request, attempts: int, timeout: float, name: str) -> str | None:
    """POST `req`, retried with backoff (0.5 s, doubling); None when it was taken, else why. A refusal
    (4xx other than 408/429) is final and says `refused:` (retrying would only repeat it); a redirect
    is not followed nor retried, and says `redirected:` (the URL is wrong: keep the document)."""
    delay = 0.5
    why = ""
    for i in range(attempts):
        try:
            with OPENER.open(req, timeout=timeout) as r:
                r.read()
            if not 200 <= r.status < 300:
                return f"{name}: HTTP {r.status}: not taken"
            return None
        except urllib.error.HTTPError as exc:
            with exc:      # its response holds a socket
                why = f"{name}: HTTP {exc.code} {exc.read()[:200]!r}"
            if 300 <= exc.code < 400:
                return (f"redirected: {name}: HTTP {exc.code} to {str(exc.headers.get('Location'))[:200]!r}, not "
                        "followed (check the sink's URL)")
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
        self._seq = itertools.count()
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
        return self._put(("patterns", text.encode()))

    def submit_steps(self, first: int, last: int, median: float, p90: float, world_size: int) -> bool:
        """Queue one summary of the always-on step-time series."""
        body = json.dumps({"first_step": first, "last_step": last, "median_seconds": median, "p90_seconds": p90,
                           "world_size": world_size}).encode()
        return self._put(("steps", body))

    def submit_hang(self, text: str) -> bool:
        """Queue a hang snapshot (the watchdog's): the service localizes the hang while the job waits."""
        return self._put(("hang", text.encode()))

    def submit_end(self) -> bool:
        """Queue the run's end (rank 0, at close): the service resolves the alerts of its open issues."""
        return self._put(("end", b"{}"))

    def messages(self) -> list[str]:
        """What failed since the last call, in words."""
        return [str(exc) for _, exc in self.errors()]

    def _note(self, msg: str) -> None:
        self._error("sink", ConnectionError(msg[:300]))

    def _post(self, kind: str, body: bytes) -> str | None:
        return post_item(self.url, self.job_id, self.job_name, self.token, kind, body, self.attempts, self.timeout)

    def _spooled(self) -> list[Path]:
        with contextlib.suppress(OSError):
            return sorted(f for f in self.spool.glob("*.json.gz") if spooled_kind(f) is not None)
        return []

    def _spool(self, kind: str, body: bytes) -> None:
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            if not (self.spool / META).exists():
                meta = {"job_id": self.job_id, "job_name": self.job_name, "url": self.url}
                (self.spool / f".{META}.tmp").write_text(json.dumps(meta))
                (self.spool / f".{META}.tmp").replace(self.spool / META)
            if len(self._spooled()) >= self.spool_max:
                self._note(f"spool {self.spool} full ({self.spool_max} files): a document was dropped")
                return
            name = f"{time.time_ns():020d}-{next(self._seq):06d}-{kind}.json.gz"    # sorts in the order made
            tmp = self.spool / f".{name}.tmp"
            tmp.write_bytes(gzip.compress(body, 1))
            tmp.replace(self.spool / name)
        except OSError as exc:
            self._note(f"spool {self.spool}: {exc!r}")

    def _drain_spool(self) -> bool:
        """Send the spooled items, oldest first; False when the service went away again."""
        for f in self._spooled():
            try:
                body = gzip.decompress(f.read_bytes())
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                self._note(f"spool {f}: unreadable ({exc!r}); dropped")
                with contextlib.suppress(OSError):
                    f.unlink()
                continue
            why = self._post(str(spooled_kind(f)), body)
            if why is not None and not why.startswith("refused"):
                return False          # the service is down again: keep the rest for later
            if why is not None:
                self._note(why)
            with contextlib.suppress(OSError):
                f.unlink()
            self.sent += why is None
        return True

    def _handle(self, item: tuple[str, bytes]) -> None:
        kind, body = item
        if self._spooled():           # older items first: this one waits its turn behind them
            self._spool(kind, body)
            if not self._drain_spool():
                self._note("the service is still unreachable; spooled")
            return
        why = self._post(kind, body)
        if why is None:
            self.sent += 1
        elif why.startswith("refused"):
            self._note(why)
        else:
            self._note(why + "; spooled")
            self._spool(kind, body)


def spooled_kind(f: Path) -> str | None:
    """The kind of a spool file (`<ns>-<seq>-<kind>.json.gz`, or an older `<ns>-<kind>.json.gz`)."""
    kind = f.name.removesuffix(".json.gz").rsplit("-", 1)[-1]
    return kind if kind in KINDS and not f.name.startswith(".") else None


def route_of(job_id: str, kind: str) -> str:
    return "/v1/patterns" if kind == "patterns" else f"/v1/jobs/{job_id}/{kind}"


def post_item(url: str, job_id: str, job_name: str | None, token: str | None, kind: str, body: bytes,
              attempts: int, timeout: float) -> str | None:
    """POST one item of `kind` for the job to the service at `url` (see post_with_retry)."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "X-Eroica-Job": job_id}
    if job_name:
        headers["X-Eroica-Job-Name"] = job_name
    if token:
        headers["Authorization"] = f"Bearer {token}"
    path = route_of(job_id, kind)
    req = urllib.request.Request(url.rstrip("/") + path, data=gzip.compress(body, 1), headers=headers, method="POST")
    return post_with_retry(req, attempts, timeout, f"{url.rstrip('/')}{path}")


def read_meta(spool: Path) -> dict[str, Any] | None:
    """A spool's job (`job_id`, `job_name`, `url`); None when it has no readable meta.json."""
    try:
        meta = json.loads((spool / META).read_text())
        return meta if isinstance(meta, dict) and isinstance(meta.get("job_id"), str) else None
    except (OSError, ValueError):
        return None
