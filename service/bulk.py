"""Many rank documents in one transaction: a host's ranks in one upload (the per-host gather
document, `application/x-ndjson`, one pattern document per line), or a spool's backlog.

A batch is all or nothing: every line is validated first, and a line that is not a valid document,
a rank outside the job's world or a different document for a rank already stored refuses the whole
batch, naming its line; nothing of it is stored. The same batch again stores nothing and says so.
Each window the batch touches is locked and updated once; the documents go in as multi-row inserts
(`INSERT ... ON CONFLICT DO NOTHING RETURNING`, on SQLite and PostgreSQL alike), and the batch's
text is kept once, compressed, with each document's row pointing at its line (eroica.service.docs)."""

from __future__ import annotations

import gzip
import hashlib
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from eroica.schema.patterns import PatternsDoc
from eroica.service.db import batches, documents, windows
from eroica.service.errors import IngestError
from eroica.service.runs import insert_ignore, touch_run, valid_job_id

MAX_LINES = 4096          # documents per batch (a host has at most a few dozen ranks)


@dataclass(frozen=True)
class BulkIngested:
    created: int             # documents stored now
    existing: int            # documents that were already stored, the same (an idempotent re-upload)
    windows: list[int]       # the windows' keys, in the order first named


def split_lines(body: bytes) -> list[tuple[int, bytes]]:
    """The batch's non-empty lines with their 1-based numbers; 413 past MAX_LINES."""
    lines = [(n, ln) for n, ln in enumerate(body.split(b"\n"), 1) if ln.strip()]
    if not lines:
        raise IngestError(400, "an empty batch: one pattern document per line was expected", "body")
    if len(lines) > MAX_LINES:
        raise IngestError(413, f"{len(lines)} documents in one batch; at most {MAX_LINES}", "body")
    return lines


def same(packed: bytes, body: bytes) -> bool:
    """`packed` is a gzip of exactly `body` (every member: a second member would be lines nobody
    validated)."""
    try:
        return gzip.decompress(packed) == body
    except (OSError, EOFError, zlib.error):
        return False


def ingest_many(eng: sa.Engine, job_id: str, docs: list[tuple[int, PatternsDoc, bytes]], now: float | None = None,
                name: str | None = None, packed: bytes | None = None) -> BulkIngested:
    """Store a batch of (line, document, its JSON text) of run `job_id` in one transaction. `packed`:
    the whole body gzip'd, when it came so (its non-empty lines are `docs`, in order), kept as is."""
    now = time.time() if now is None else now
    valid_job_id(job_id)
    world = docs[0][1].job.world_size
    by_window: dict[str, list[tuple[int, PatternsDoc, bytes]]] = defaultdict(list)
    seen: dict[tuple[str, int], int] = {}
    for line, doc, text in docs:
        if doc.job.world_size != world:
            raise IngestError(422, f"line {line}: world size {doc.job.world_size}, line {docs[0][0]} says {world}",
                              "job.world_size")
        if doc.job.rank >= world:
            raise IngestError(422, f"line {line}: rank {doc.job.rank} is outside the job's world of {world}",
                              "job.rank")
        key = (doc.window.window_id, doc.job.rank)
        if key in seen:
            raise IngestError(422, f"line {line}: rank {doc.job.rank} of window {key[0]} again (line {seen[key]})",
                              "job.rank")
        seen[key] = line
        by_window[doc.window.window_id].append((line, doc, text))
    dialect = postgresql if eng.dialect.name == "postgresql" else sqlite
    created = existing = 0
    pks: list[int] = []
    # the batch is kept once, as its lines (a document's `line` is its index among them)
    index = {line: i for i, (line, _, _) in enumerate(docs)}
    if packed is None:
        packed = gzip.compress(b"".join(text.strip() + b"\n" for _, _, text in docs), 1)
    with eng.begin() as c:
        batch_pk = c.execute(batches.insert().values(body=packed, received_at=now).returning(batches.c.pk)).scalar_one()
        for host in sorted({d.job.hostname for _, d, _ in docs}):
            touch_run(c, job_id, name, world, host, now, "job.world_size")
        for wid, items in by_window.items():
            win = items[0][1].window
            locked = (sa.select(windows).where(windows.c.job_id == job_id, windows.c.window_id == wid)
                      .with_for_update(key_share=True))
            w = c.execute(locked).mappings().first()
            if w is None:              # the window's first documents (or another replica's, at the same moment)
                insert_ignore(c, windows, {
                    "job_id": job_id, "window_id": wid, "world_size": world, "start_step": win.start_step,
                    "end_step": win.end_step, "trigger": win.trigger, "status": "collecting", "ranks_reported": 0,
                    "first_doc_at": now, "last_doc_at": now, "attempts": 0}, ["job_id", "window_id"])
                w = c.execute(locked).mappings().one()
            pk = w["pk"]
            pks.append(pk)
            rows = {doc.job.rank: {"window_pk": pk, "rank": doc.job.rank,
                                   "sha256": hashlib.sha256(text.strip()).hexdigest(), "body": None,
                                   "batch_pk": batch_pk, "line": index[line], "host": doc.job.hostname,
                                   "received_at": now}
                    for line, doc, text in items}
            ranks = list(rows)
            # executemany: one compiled statement, sent as multi-row INSERTs (SQLAlchemy's insertmanyvalues)
            stmt = dialect.insert(documents).on_conflict_do_nothing(index_elements=["window_pk", "rank"])
            stored = set(c.execute(stmt.returning(documents.c.rank), [rows[r] for r in ranks]).scalars())
            again = [r for r in ranks if r not in stored]
            if again:
                old = {r: h for r, h in c.execute(sa.select(documents.c.rank, documents.c.sha256).where(
                    documents.c.window_pk == pk, documents.c.rank.in_(again)))}
                for line, doc, _ in items:
                    r = doc.job.rank
                    if r in old and old[r] != rows[r]["sha256"]:
                        raise IngestError(409, f"line {line}: window {wid} already has a different document for "
                                               f"rank {r}; nothing of this batch was stored", "job.rank")
            created += len(stored)
            existing += len(again)
            if stored:
                upd = _window_update(w, items, len(stored), now)
                c.execute(windows.update().where(windows.c.pk == pk).values(**upd))
        if not created:            # all of it was here already: keep nothing of this copy
            c.execute(batches.delete().where(batches.c.pk == batch_pk))
    return BulkIngested(created, existing, pks)


def _window_update(w: Any, items: list[tuple[int, PatternsDoc, bytes]], n: int, now: float) -> dict[str, Any]:
    update: dict[str, Any] = {"ranks_reported": windows.c.ranks_reported + n, "last_doc_at": now}
    opened = [d.window.opened_unix_seconds for _, d, _ in items if d.window.opened_unix_seconds is not None]
    if opened and (w["window_opened_at"] is None or min(opened) < w["window_opened_at"]):
        update["window_opened_at"] = min(opened)
    closed = [d.window.closed_unix_seconds for _, d, _ in items if d.window.closed_unix_seconds is not None]
    if closed and (w["window_closed_at"] is None or max(closed) > w["window_closed_at"]):
        update["window_closed_at"] = max(closed)
    if w["status"] in ("done", "failed"):
        update.update(status="ready", attempts=0)       # late ranks: diagnose the window again with them
    return update
