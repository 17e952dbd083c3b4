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
import os
import re
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

from eroica.collector.writer import QueueThread
from eroica.schema.raw_trace import RawTraceHeader, pack
from eroica.schema.steps import StepSeriesSummary

ENV = "EROICA_SINK"
SERIES_EVERY = 20       # steps per summary of the always-on step-time series (rank 0)
TOKEN_ENV = "EROICA_SINK_TOKEN"
KINDS = ("patterns", "batch", "steps", "hang", "end", "traces")     # batch: many documents, one per line
BATCH_LINES = 256          # spooled documents replayed in one request, at most
BATCH_BYTES = 8 << 20
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

    def submit_batch(self, text: str) -> bool:
        """Queue many pattern documents, one per line (a host's ranks, gathered): one request."""
        return self._put(("batch", text.encode()))

    def submit_steps(self, first: int, last: int, median: float, p90: float, world_size: int) -> bool:
        """Queue one summary of the always-on step-time series."""
        try:
            body = StepSeriesSummary(first_step=first, last_step=last, median_seconds=median, p90_seconds=p90,
                                     world_size=world_size).model_dump_json().encode()
        except ValueError as exc:      # pydantic's ValidationError: a summary the service would refuse
            self._note(f"step summary {first}-{last} not sent: {str(exc).splitlines()[-1][:200]}")
            return False
        return self._put(("steps", body))

    def submit_hang(self, text: str) -> bool:
        """Queue a hang snapshot (the watchdog's): the service localizes the hang while the job waits."""
        return self._put(("hang", text.encode()))

    def submit_trace(self, window_id: str, rank: int, world_size: int, host: str | None, path: Path) -> bool:
        """Queue a kept raw trace (its file read now, off the training thread: the keeper's or the
        closing window's); False when the queue is full or the file cannot be read (said)."""
        try:
            body = pack(RawTraceHeader(window_id=window_id, rank=rank, world_size=world_size, host=host),
                        Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            self._note(f"raw trace of {window_id} ({path}) not sent: {exc!r}"[:300])
            return False
        return self._put(("traces", body))

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

    def _read_spooled(self, f: Path) -> bytes | None:
        try:
            return gzip.decompress(f.read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            self._note(f"spool {f}: unreadable ({exc!r}); dropped")
            with contextlib.suppress(OSError):
                f.unlink()
            return None

    def _drain_spool(self) -> bool:
        """Send the spooled items, oldest first, consecutive pattern documents together as batches
        (a backlog of a thousand windows is a few requests); False when the service went away again."""
        for run in spool_runs(self._spooled()):
            bodies = [(f, b) for f in run if (b := self._read_spooled(f)) is not None]
            if not bodies:
                continue
            kind = str(spooled_kind(run[0]))
            if len(bodies) > 1 or kind == "batch":
                why = self._post("batch", b"".join(b.rstrip(b"\n") + b"\n" for _, b in bodies))
                if why is None or not why.startswith("refused") or len(bodies) == 1:
                    if not self._settle(why, [f for f, _ in bodies], len(bodies)):
                        return False
                    continue
                # one document of the batch is refused, so all are: each alone, the bad one dropped
            for f, b in bodies:
                if not self._settle(self._post(str(spooled_kind(f)), b), [f], 1):
                    return False
        return True

    def _settle(self, why: str | None, files: list[Path], n: int) -> bool:
        """After a send of `files`: remove them (sent, or refused: they would be again); False when
        the service is unreachable (they stay)."""
        if why is not None and not why.startswith("refused"):
            return False
        if why is not None:
            self._note(why)
        for f in files:
            with contextlib.suppress(OSError):
                f.unlink()
        self.sent += n if why is None else 0
        return True

    def _handle(self, item: tuple[str, bytes]) -> None:
        kind, body = item
        if kind == "batch":           # a leader's gathered ranks: requests of at most BATCH_LINES documents
            for chunk in split_batch(body):
                self._handle_one(kind, chunk)
            return
        self._handle_one(kind, body)

    def _handle_one(self, kind: str, body: bytes) -> None:
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


def split_batch(body: bytes) -> list[bytes]:
    """A batch's lines in pieces of at most BATCH_LINES documents and about BATCH_BYTES."""
    out: list[bytes] = []
    cur: list[bytes] = []
    size = 0
    for ln in body.splitlines():
        if not ln.strip():
            continue
        if cur and (len(cur) >= BATCH_LINES or size + len(ln) > BATCH_BYTES):
            out.append(b"\n".join(cur) + b"\n")
            cur, size = [], 0
        cur.append(ln)
        size += len(ln) + 1
    if cur:
        out.append(b"\n".join(cur) + b"\n")
    return out


def spool_runs(files: list[Path]) -> list[list[Path]]:
    """Spool files in order, consecutive single pattern documents grouped up to BATCH_LINES files or
    BATCH_BYTES compressed; every other item (a batch already is one) alone."""
    runs: list[list[Path]] = []
    size = 0
    for f in files:
        doc = spooled_kind(f) == "patterns"
        try:
            n = f.stat().st_size if doc else 0
        except OSError:          # taken meanwhile (eroica ingest spool, a watching service)
            n = 0
        last = runs[-1] if runs else None
        if (doc and last is not None and spooled_kind(last[0]) == "patterns"
                and len(last) < BATCH_LINES and size + n <= BATCH_BYTES):
            last.append(f)
            size += n
        else:
            runs.append([f])
            size = n
    return runs


def route_of(job_id: str, kind: str) -> str:
    return "/v1/patterns" if kind in ("patterns", "batch") else f"/v1/jobs/{job_id}/{kind}"


def post_item(url: str, job_id: str, job_name: str | None, token: str | None, kind: str, body: bytes,
              attempts: int, timeout: float) -> str | None:
    """POST one item of `kind` for the job to the service at `url` (see post_with_retry)."""
    ctype = "application/x-ndjson" if kind == "batch" else "application/json"
    headers = {"Content-Type": ctype, "Content-Encoding": "gzip", "X-Eroica-Job": job_id}
    if job_name:
        headers["X-Eroica-Job-Name"] = job_name
    if token:
        headers["Authorization"] = f"Bearer {token}"
    path = route_of(job_id, kind)
    req = urllib.request.Request(url.rstrip("/") + path, data=gzip.compress(body, 1), headers=headers, method="POST")
    return post_with_retry(req, attempts, timeout, f"{url.rstrip('/')}{path}")


class GzipTooLarge(ValueError):
    """A gzip member that decompresses past its bound (a bomb stops there)."""


def gunzip_member(data: bytes, limit: int) -> tuple[bytes, bool]:
    """One gzip member decompressed to at most `limit` bytes, and whether it was all of `data` (nothing after
    the member); GzipTooLarge past the bound, ValueError for a stream that is not gzip or one cut short."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not gzip: {exc}") from exc
    if len(out) > limit:
        raise GzipTooLarge(f"over {limit} bytes once decompressed")
    if not d.eof:
        raise ValueError("a truncated gzip stream")
    return out, not d.unused_data


def gunzip_at_most(data: bytes, limit: int) -> bytes:
    """One gzip member decompressed to at most `limit` bytes (gunzip_member's errors)."""
    return gunzip_member(data, limit)[0]


def read_meta(spool: Path) -> dict[str, Any] | None:
    """A spool's job (`job_id`, `job_name`, `url`); None when it has no readable meta.json."""
    try:
        meta = json.loads((spool / META).read_text())
        return meta if isinstance(meta, dict) and isinstance(meta.get("job_id"), str) else None
    except (OSError, ValueError):
        return None


JOB_ID = re.compile(r"[^A-Za-z0-9._-]+")


def make_sink(url: str | None, job: str, out_dir: Path, rank: int) -> PatternSink | None:
    """A sink when one is named (the argument, else EROICA_SINK); the job's id is its name, else the
    run directory's name; what cannot be sent is spooled under the run directory."""
    url = url or os.environ.get(ENV) or None
    if not url:
        return None
    return PatternSink(url, sink_job_id(job, out_dir), out_dir / ".spool" / f"rank-{rank}",
                       os.environ.get(TOKEN_ENV), job_name=sink_job_name(job))


def sink_job_id(job: str, out_dir: Path) -> str:
    """The run's id at the service: its run directory's name (one per run, the same on every rank),
    after the job's name when it has a real one. A scheduler's name alone would merge runs: torchrun
    sets TORCHELASTIC_RUN_ID to "none" for every static job, and a restarted job keeps its name."""
    run = out_dir.resolve().name
    name = _real_name(job)
    raw = run if not name or name == run else f"{name}.{run}"
    return JOB_ID.sub("-", raw).strip("-.")[-128:].lstrip("-.") or "job"


def _real_name(job: str) -> str:
    """The scheduler's name when it is one: torchrun's static "none" and the like are not."""
    return "" if job.strip().lower() in ("", "none", "default") else job.strip()


def sink_job_name(job: str) -> str | None:
    """The job's name at the service, shared by its runs (so a restart is followed), when it has a
    real one; None otherwise (each run then stands alone)."""
    return JOB_ID.sub("-", _real_name(job)).strip("-.")[:128].strip("-.") or None
