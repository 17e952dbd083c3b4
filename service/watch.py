"""Ingestion from a shared path: watch run roots for `RUN_DIR/<window>/rank-R.json` and packed files
as the collectors write them (atomically: a temporary dot-file, then a rename), and for what a
job's sink spooled when it could not reach the service (`RUN_DIR/.spool/rank-R/`), which is then
ingested and removed.

A watched root is read as untrusted input: only regular files inside it (no symlink is followed out of it, no
FIFO, device or socket is opened), each no larger than the body limit before and after decompression; and its
writers are scoped like a job token: a root given as `ROOT=GLOB` writes only jobs whose id and name match the
glob, and never a job a writer of another scope created (`service/runs.py`): a team's root given its token's
glob replays the spools of that team's jobs, and no other team's.

The file system tells (inotify, through watchdog): a new or renamed file is ingested within a
moment, and a quiet root costs nothing. inotify can lose events (its queue overflows, a new
directory's first files land before its watch exists, network file systems send none), so a slow
reconcile scan (every `reconcile_seconds`, 300 by default) walks the roots too; when inotify cannot
be had (its watch limit), the scan alone runs, more often. The job's id is the run directory's
path under its root. Re-reading a file is harmless: ingestion is idempotent."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import queue
import re
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from pydantic import ValidationError

from eroica.collector.sink import gunzip_at_most, spooled_kind
from eroica.schema.raw_trace import RawTraceHeader, pack
from eroica.schema.steps import StepSeriesSummary
from eroica.service import hangs, store, traces
from eroica.service.db import jobs, reading
from eroica.service.errors import ServiceError
from eroica.service.inputs import refusal
from eroica.service.runs import JOB_ID

if TYPE_CHECKING:
    from eroica.service.app import Service

log = logging.getLogger("eroica.service")
WINDOW_DIR = re.compile(r"^w\d+-s\d+$")
FALLBACK_SCAN_SECONDS = 10.0


TRACE_FILE = re.compile(r"^rank-(\d{1,7})\.trace\.json$")      # a kept raw trace (eroica.collector.raw_keep)


def is_window_file(f: Path) -> bool:
    n = f.name
    return not n.startswith(".") and (n.startswith("rank-") and n.endswith(".json")
                                      or n.startswith("pack-") and n.endswith(".jsonl"))


SYMLINK = "a symbolic link: never followed"
NOT_REGULAR = "not a regular file (a FIFO, a device or a socket): never opened"


class Unsafe(Exception):
    """A file of a watched root that is not read: why."""


def read_inside(f: Path, root: Path, limit: int) -> bytes:
    """The bytes of `f`, a regular file inside `root`, at most `limit` of them. Refused without reading: a
    path whose directory leads out of the root (a symlinked directory), a symlink (O_NOFOLLOW), a FIFO, a
    device or a socket (opened non-blocking, so a FIFO with no writer does not wait, then refused by its
    type), and a file over the limit (by its size, and again by what is read: it may grow)."""
    if not f.parent.resolve().is_relative_to(root):
        raise Unsafe(f"its directory leads out of the watched root {root}")
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Unsafe(SYMLINK if os.path.islink(f) else f"cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(NOT_REGULAR)
        if st.st_size > limit:
            raise Unsafe(f"{st.st_size} bytes, over the limit of {limit} (serve --max-body-bytes)")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:
            raise Unsafe(f"over the limit of {limit} bytes as it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """A gzip member decompressed to at most `limit` bytes (a bomb stops there)."""
    try:
        return gunzip_at_most(data, limit)
    except ValueError as exc:
        raise Unsafe(str(exc)) from exc


def parse_root(spec: str | Path) -> tuple[Path, str]:
    """`ROOT` or `ROOT=GLOB`: the directory and the job ids and names it may write ("*": any). An empty
    GLOB (`ROOT=`, a template's unset variable) is refused: it would widen a team's root to every job."""
    text = str(spec)
    root, _, glob = text.partition("=") if "=" in text else (text, "", "*")
    if not glob.strip():
        raise ValueError(f"--watch {text!r}: the scope after '=' is empty (give a job-name glob, or '*' for any job)")
    return Path(root).resolve(), glob


class Watcher:
    def __init__(self, svc: Service, roots: Sequence[Path | str], reconcile_seconds: float = 300.0) -> None:
        self.svc, self.reconcile_seconds = svc, reconcile_seconds
        self.scopes = dict(parse_root(r) for r in roots)
        self.roots = list(self.scopes)
        self.limit = int(getattr(svc.settings, "max_body_bytes", 8 * 1024 * 1024))
        self.seen: dict[Path, tuple[int, int]] = {}
        self.refused: set[Path] = set()
        self.scans = 0
        self.events: queue.Queue[Path] = queue.Queue(maxsize=100_000)
        self.overflowed = False

    def job_id(self, root: Path, run_dir: Path) -> str | None:
        rel = run_dir.relative_to(root).as_posix() if run_dir != root else root.name
        jid = rel.replace("/", ".")
        return jid if JOB_ID.match(jid) else None

    def _root_of(self, f: Path) -> Path | None:
        return next((r for r in self.roots if f.is_relative_to(r)), None)

    def _refuse(self, f: Path, why: str) -> None:
        if f not in self.refused and len(self.refused) < 100_000:
            self.refused.add(f)
            log.warning("eroica serve: %s: %s: not read", f, why)

    def _writer(self, root: Path, job: str, name: str | None) -> str | None:
        """Why this root may not write `job` (None: it may): its scope, then the job's creator."""
        glob = self.scopes[root]
        for what in (job, *([name] if name else [])):
            if not fnmatch.fnmatchcase(what, glob):
                return f"job {what!r} is outside the scope {glob!r} of the watched root {root}"
        return self.svc.writer_refusal(job, f"scope:{glob}")

    # ---------------------------------------------------------------- one file
    def consider(self, f: Path) -> int:
        """Ingest `f` if it is a window's file or a spooled item not seen in this state; how many
        documents were stored."""
        root = self._root_of(f)
        if root is None:
            return 0
        if f.parent.parent.name == ".spool" and spooled_kind(f) is not None:
            return self._spooled(f)
        if not (WINDOW_DIR.match(f.parent.name) and is_window_file(f)):
            return 0
        job = self.job_id(root, f.parent.parent)
        if job is None:
            return 0
        try:
            st = f.lstat()
        except OSError:
            return 0
        if not stat.S_ISREG(st.st_mode):        # a symlink, a FIFO, a device: never opened
            self._refuse(f, SYMLINK if stat.S_ISLNK(st.st_mode) else NOT_REGULAR)
            return 0
        key = (st.st_size, st.st_mtime_ns)
        if self.seen.get(f) == key:
            return 0
        self.seen[f] = key
        why = self._writer(root, job, None)
        if why is not None:
            self._refuse(f, why)
            return 0
        t = TRACE_FILE.match(f.name)
        if t is not None:
            if not self._trace(job, f, int(t.group(1)), root):
                del self.seen[f]                  # its job is not known yet: the next scan tries again
            return 0
        return self._ingest(job, f, root)

    def _trace(self, job: str, f: Path, rank: int, root: Path) -> bool:
        """A kept raw trace beside the window's documents, stored for the job's page; False when the
        job is not known yet (its world size comes from its documents)."""
        with reading(self.svc.eng) as c:
            world = c.execute(sa.select(jobs.c.world_size).where(jobs.c.id == job)).scalar()
        if world is None:
            return False
        try:
            body = read_inside(f, root, self.limit)
            head, packed = traces.parse(pack(RawTraceHeader(window_id=f.parent.name, rank=rank, world_size=world),
                                             body))
            traces.add(self.svc.eng, job, head, packed, len(body))
        except ServiceError as exc:
            log.warning("eroica serve: %s: %s (%s)", f, exc.message, exc.field)
        except Unsafe as exc:
            log.warning("eroica serve: %s: %s: not read", f, exc)
        except (OSError, ValueError) as exc:
            log.warning("eroica serve: %s: %r", f, exc)
        return True

    def _ingest(self, job: str, f: Path, root: Path) -> int:
        try:
            text = read_inside(f, root, self.limit)
        except Unsafe as exc:
            log.warning("eroica serve: %s: %s: not read", f, exc)
            return 0
        except OSError as exc:
            log.warning("eroica serve: %s: %r", f, exc)
            return 0
        parts = [ln for ln in text.splitlines() if ln.strip()] if f.suffix == ".jsonl" else [text]
        n = 0
        for i, part in enumerate(parts, 1):
            try:
                n += int(self.svc.accept(job, part, f"{f}" + (f":{i}" if f.suffix == ".jsonl" else "")).created)
            except ServiceError as exc:
                log.warning("eroica serve: %s%s: %s (%s)", f, f":{i}" if len(parts) > 1 else "", exc.message,
                            exc.field)
        return n

    def _spooled(self, f: Path) -> int:
        """One item a job's sink spooled: stored as the API would (its kind is in its name, its job
        in the spool's meta.json), then removed; a refused one is removed too (it would be again)."""
        root = self._root_of(f)
        if root is None:
            return 0
        try:
            meta = json.loads(read_inside(f.parent / "meta.json", root, 64 * 1024))
        except (Unsafe, OSError, ValueError) as exc:
            self._refuse(f, f"its spool's meta.json: {exc}")
            return 0
        if not isinstance(meta, dict) or not isinstance(meta.get("job_id"), str) or not JOB_ID.match(meta["job_id"]):
            return 0
        job, name = meta["job_id"], meta.get("job_name") or None
        if not isinstance(name, (str, type(None))):
            return 0
        why = self._writer(root, job, name)
        if why is not None:                       # left in place: the service's log says why, once
            self._refuse(f, why)
            return 0
        kind = spooled_kind(f)
        stored = 0
        try:
            body = gunzip_bounded(read_inside(f, root, self.limit), self.limit)
            if kind == "patterns":
                stored = int(self.svc.accept(job, body, str(f), name=name).created)
            elif kind == "batch":
                stored = self.svc.accept_many(job, body, str(f), name=name).created
            elif kind == "steps":
                try:
                    s = StepSeriesSummary.model_validate_json(body)
                except ValidationError as exc:
                    raise refusal(exc) from exc
                store.add_steps(self.svc.eng, job, s.first_step, s.last_step, s.median_seconds, s.p90_seconds,
                                s.world_size, name=name)
            elif kind == "hang":
                hangs.add(self.svc.eng, job, hangs.parse(body), name=name)
            elif kind == "end":
                store.end_job(self.svc.eng, job, "job")
            elif kind == "traces":
                head, packed = traces.parse(body)
                traces.add(self.svc.eng, job, head, packed, len(body), name=name)
        except ServiceError as exc:
            log.warning("eroica serve: spooled %s: %s (%s): removed", f, exc.message, exc.field)
        except Unsafe as exc:
            log.warning("eroica serve: spooled %s: %s: not read", f, exc)
            return 0
        except OSError as exc:
            log.warning("eroica serve: spooled %s: %r", f, exc)
            return 0
        try:
            f.unlink()
        except OSError:
            pass
        return stored

    # ---------------------------------------------------------------- whole trees
    def scan(self) -> int:
        """Walk every root (the reconcile); how many documents were stored."""
        self.scans += 1
        stored = 0
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                d = Path(dirpath)
                dirnames[:] = [n for n in dirnames if not n.startswith(".") or n == ".spool"
                               or d.name == ".spool"]
                if WINDOW_DIR.match(d.name) or d.parent.name == ".spool":
                    for n in sorted(filenames):
                        stored += self.consider(d / n)
        return stored

    def _walk_new_dir(self, d: Path) -> None:
        """A directory that just appeared: its first files may predate its watch."""
        for dirpath, _, filenames in os.walk(d):
            for n in sorted(filenames):
                self._queue(Path(dirpath) / n)

    def _queue(self, p: Path) -> None:
        try:
            self.events.put_nowait(p)
        except queue.Full:
            self.overflowed = True          # the next reconcile picks them up

    def _observer(self) -> Any:
        """An inotify observer on the roots, or None (and why, in the log) when it cannot be had."""
        try:
            from watchdog.events import (
                DirCreatedEvent,
                DirMovedEvent,
                FileClosedEvent,
                FileCreatedEvent,
                FileMovedEvent,
                FileSystemEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers import Observer
        except ImportError as exc:
            log.warning("eroica serve: --watch without inotify (watchdog: %r): scanning every %.0f s", exc,
                        FALLBACK_SCAN_SECONDS)
            return None
        me = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                path = getattr(event, "dest_path", "") or event.src_path
                p = Path(os.fsdecode(path))
                if event.event_type == "created" and event.is_directory:
                    me._walk_new_dir(p)
                elif not event.is_directory and event.event_type in ("moved", "closed", "created"):
                    me._queue(p)

        obs = Observer()
        try:
            # only what says a file is there to read: a rename into place, a close after writing, a new
            # file or directory; not the opens and reads ingestion itself makes (they would flood the queue)
            wanted: list[type[FileSystemEvent]] = [FileMovedEvent, DirMovedEvent, FileCreatedEvent, DirCreatedEvent,
                                                   FileClosedEvent]
            for root in self.roots:
                obs.schedule(Handler(), str(root), recursive=True, event_filter=wanted)
            obs.start()
        except OSError as exc:
            log.warning("eroica serve: --watch: inotify refused (%s; see fs.inotify.max_user_watches): scanning "
                        "every %.0f s instead", exc, FALLBACK_SCAN_SECONDS)
            return None
        return obs

    def run(self, stop: threading.Event) -> None:
        obs = self._observer()
        every = self.reconcile_seconds if obs is not None else min(self.reconcile_seconds, FALLBACK_SCAN_SECONDS)
        next_scan = 0.0
        try:
            while not stop.is_set():
                try:
                    if time.monotonic() >= next_scan or self.overflowed:
                        self.overflowed = False
                        self.scan()
                        next_scan = time.monotonic() + every
                    try:
                        p = self.events.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    batch = {p}
                    while len(batch) < 10_000:
                        try:
                            batch.add(self.events.get_nowait())
                        except queue.Empty:
                            break
                    for f in sorted(batch):
                        self.consider(f)
                except Exception as exc:   # a vanished file or directory, a database hiccup: next round
                    log.warning("eroica serve: watching %s: %r", ", ".join(map(str, self.roots)), exc)
                    stop.wait(1.0)
        finally:
            if obs is not None:
                obs.stop()
                obs.join(5)
