"""Ingestion from a shared path: watch run roots for `RUN_DIR/<window>/rank-R.json` and packed files
as the collectors write them (atomically: a temporary dot-file, then a rename). The job's id is the
run directory's path under its root. Re-reading a file after a restart is harmless: ingestion is
idempotent."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from eroica.service.errors import IngestError
from eroica.service.store import JOB_ID

if TYPE_CHECKING:
    from eroica.service.app import Service

log = logging.getLogger("eroica.service")
WINDOW_DIR = re.compile(r"^w\d+-s\d+$")


class Watcher:
    def __init__(self, svc: Service, roots: list[Path], every_seconds: float = 1.0) -> None:
        self.svc, self.roots, self.every = svc, [Path(r) for r in roots], every_seconds
        self.seen: dict[Path, tuple[int, int]] = {}

    def job_id(self, root: Path, run_dir: Path) -> str | None:
        rel = run_dir.relative_to(root).as_posix() if run_dir != root else root.name
        jid = rel.replace("/", ".")
        return jid if JOB_ID.match(jid) else None

    def scan(self) -> int:
        """Ingest every new or changed pattern file under the roots; how many documents were stored."""
        stored = 0
        for root in self.roots:
            if not root.is_dir():
                continue
            for wdir in root.rglob("w*-s*"):
                if not (wdir.is_dir() and WINDOW_DIR.match(wdir.name)):
                    continue
                job = self.job_id(root, wdir.parent)
                if job is None:
                    continue
                for f in sorted(wdir.iterdir()):
                    if f.name.startswith(".") or not (f.name.endswith(".json") and f.name.startswith("rank-")
                                                      or f.name.startswith("pack-") and f.name.endswith(".jsonl")):
                        continue
                    st = f.stat()
                    key = (st.st_size, st.st_mtime_ns)
                    if self.seen.get(f) == key:
                        continue
                    self.seen[f] = key
                    stored += self._ingest(job, f)
        return stored

    def _ingest(self, job: str, f: Path) -> int:
        text = f.read_bytes()
        parts = [ln for ln in text.splitlines() if ln.strip()] if f.suffix == ".jsonl" else [text]
        n = 0
        for i, part in enumerate(parts, 1):
            try:
                n += int(self.svc.accept(job, part, f"{f}" + (f":{i}" if f.suffix == ".jsonl" else "")).created)
            except IngestError as exc:
                log.warning("eroica serve: %s%s: %s (%s)", f, f":{i}" if len(parts) > 1 else "", exc.message,
                            exc.field)
        return n

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.scan()
            except Exception as exc:   # a vanished file or directory mid-scan: next round
                log.warning("eroica serve: watching %s: %r", ", ".join(map(str, self.roots)), exc)
            stop.wait(self.every)
