"""Many rank documents in one transaction: a host's ranks in one upload (the per-host gather
document, `application/x-ndjson`, one pattern document per line), or a spool's backlog.

A batch is all or nothing: every line is validated first, and a line that is not a valid document,
a rank outside the job's world or a different document for a rank already stored refuses the whole
batch, naming its line; nothing of it is stored. The same batch again stores nothing and says so.
Each window the batch touches is locked and updated once; the documents go in as multi-row inserts
(`INSERT ... ON CONFLICT DO NOTHING RETURNING`, on SQLite and PostgreSQL alike), and the batch's
text is kept once, compressed, with each document's row pointing at its line (eroica.service.docs),
and the documents, already parsed to be validated, are kept as columns per window too
(eroica.engine.column_chunks), so the diagnosis does not parse them again."""

from __future__ import annotations

import functools
import gzip
import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from eroica.engine.column_chunks import encode as encode_chunk
from eroica.engine.columns import ColumnsBuilder
from eroica.schema.patterns import PatternsDoc
from eroica.service.db import batch_columns, batches, documents, windows, writing
from eroica.service.errors import Conflict, Invalid, Malformed, TooLarge
from eroica.service.runs import touch_run, valid_job_id

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
        raise Malformed("an empty batch: one pattern document per line was expected", "body")
    if len(lines) > MAX_LINES:
        raise TooLarge(f"{len(lines)} documents in one batch; at most {MAX_LINES}", "body")
    return lines


def ingest_many(eng: sa.Engine, job_id: str, docs: list[tuple[int, PatternsDoc, bytes]], now: float | None = None,
                name: str | None = None, packed: bytes | None = None, alone: bool = False) -> BulkIngested:
    """Store a batch of (line, document, its JSON text) of run `job_id` in one transaction. `packed`:
    the whole body gzip'd, when it came so (its non-empty lines are `docs`, in order), kept as is.
    `alone`: one document uploaded by itself, kept in its own row (no batch row)."""
    now = time.time() if now is None else now
    valid_job_id(job_id)
    world = docs[0][1].job.world_size
    by_window: dict[str, list[tuple[int, PatternsDoc, bytes]]] = defaultdict(list)
    seen: dict[tuple[str, int], int] = {}
    where = (lambda n: "") if alone else (lambda n: f"line {n}: ")  # noqa: E731
    for line, doc, text in docs:
        if doc.job.world_size != world:
            raise Invalid(f"{where(line)}world size {doc.job.world_size}, line {docs[0][0]} says {world}",
                              "job.world_size")
        if doc.job.rank >= world:
            raise Invalid(f"{where(line)}rank {doc.job.rank} is outside the job's world of {world}",
                              "job.rank")
        key = (doc.window.window_id, doc.job.rank)
        if key in seen:
            raise Invalid(f"{where(line)}rank {doc.job.rank} of window {key[0]} again (line {seen[key]})",
                              "job.rank")
        seen[key] = line
        by_window[doc.window.window_id].append((line, doc, text))
    st = _statements(eng.dialect.name)
    created = existing = 0
    pks: list[int] = []
    index = {line: i for i, (line, _, _) in enumerate(docs)}   # a document's line: its index among the batch's
    if not alone and packed is None:
        packed = gzip.compress(b"".join(text.strip() + b"\n" for _, _, text in docs), 1)
    # each window's documents of this batch as columns, built before the transaction (they are
    # kept only where every one of them is stored now)
    chunks = {} if alone else {wid: _chunk(items, index) for wid, items in by_window.items()}
    with writing(eng) as c:
        batch_pk = None if alone else c.execute(st.batch, {"body": packed, "received_at": now}).scalar_one()
        for host in sorted({d.job.hostname for _, d, _ in docs}):
            touch_run(c, job_id, name, world, host, now, "job.world_size")
        for wid, items in by_window.items():
            pk = c.execute(st.window, {"job": job_id, "wid": wid}).scalar()
            if pk is None:             # the window's first documents (or another replica's, at the same moment)
                win = items[0][1].window
                c.execute(st.new_window, {
                    "job_id": job_id, "window_id": wid, "world_size": world, "start_step": win.start_step,
                    "end_step": win.end_step, "trigger": win.trigger, "status": "collecting", "ranks_reported": 0,
                    "first_doc_at": now, "last_doc_at": now, "attempts": 0})
                pk = c.execute(st.window, {"job": job_id, "wid": wid}).scalar_one()
            pks.append(pk)
            rows = {doc.job.rank: {"window_pk": pk, "rank": doc.job.rank,
                                   "sha256": hashlib.sha256(text.strip()).hexdigest(),
                                   "body": gzip.compress(text, 1) if alone else None,
                                   "batch_pk": batch_pk, "line": None if alone else index[line],
                                   "host": doc.job.hostname, "received_at": now}
                    for line, doc, text in items}
            ranks = list(rows)
            # executemany: one compiled statement, sent as multi-row INSERTs (SQLAlchemy's insertmanyvalues)
            stored = set(c.execute(st.documents, [rows[r] for r in ranks]).scalars())
            again = [r for r in ranks if r not in stored]
            if again:
                old = {r: h for r, h in c.execute(sa.select(documents.c.rank, documents.c.sha256).where(
                    documents.c.window_pk == pk, documents.c.rank.in_(again)))}
                for line, doc, _ in items:
                    r = doc.job.rank
                    if r in old and old[r] != rows[r]["sha256"]:
                        raise Conflict(f"{where(line)}window {wid} already has a different document for "
                                               f"rank {r}" + ("" if alone else "; nothing of this batch was stored"),
                                          "job.rank")
            if batch_pk is not None and len(stored) == len(items):
                c.execute(st.chunk, {"window_pk": pk, "batch_pk": batch_pk, "body": chunks[wid]})
            created += len(stored)
            existing += len(again)
            if stored:                 # the window's row is locked here, by this one statement, until commit
                c.execute(st.window_update, _window_update(pk, items, len(stored), now))
        if batch_pk is not None and not created:      # all of it was here already: keep nothing of this copy
            c.execute(batches.delete().where(batches.c.pk == batch_pk))
    return BulkIngested(created, existing, pks)


@dataclass(frozen=True)
class _Statements:
    """The ingestion's statements, built once per dialect and executed with parameters (building a
    statement costs more than running it on a small row)."""

    batch: Any
    window: Any
    new_window: Any
    documents: Any
    window_update: Any
    chunk: Any


@functools.cache
def _statements(dialect_name: str) -> _Statements:
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    w = windows.c
    opened, closed = (sa.cast(sa.bindparam(k, type_=sa.Float), sa.Float) for k in ("opened", "closed"))
    finished = w.status.in_(("done", "failed"))
    # one UPDATE, its new values computed from the row's own (the earliest open, the latest close,
    # late ranks sending a diagnosed window back to be diagnosed again with them), so the row lock
    # it takes is held only from this statement to the commit: uploads of one window's hosts
    # serialize on that, not on their whole transactions
    update = (windows.update().where(w.pk == sa.bindparam("window")).values(
        ranks_reported=w.ranks_reported + sa.bindparam("n", type_=sa.Integer),
        last_doc_at=sa.bindparam("now", type_=sa.Float),
        window_opened_at=sa.case((opened.is_(None), w.window_opened_at),
                                 (sa.or_(w.window_opened_at.is_(None), opened < w.window_opened_at), opened),
                                 else_=w.window_opened_at),
        window_closed_at=sa.case((closed.is_(None), w.window_closed_at),
                                 (sa.or_(w.window_closed_at.is_(None), closed > w.window_closed_at), closed),
                                 else_=w.window_closed_at),
        status=sa.case((finished, "ready"), else_=w.status),
        attempts=sa.case((finished, 0), else_=w.attempts)))
    return _Statements(
        batch=batches.insert().returning(batches.c.pk),
        window=sa.select(w.pk).where(w.job_id == sa.bindparam("job"), w.window_id == sa.bindparam("wid")),
        new_window=dialect.insert(windows).on_conflict_do_nothing(index_elements=["job_id", "window_id"]),
        documents=(dialect.insert(documents).on_conflict_do_nothing(index_elements=["window_pk", "rank"])
                   .returning(documents.c.rank)),
        window_update=update,
        chunk=batch_columns.insert(),
    )


def _chunk(items: list[tuple[int, PatternsDoc, bytes]], index: dict[int, int]) -> bytes:
    """A window's documents of one batch as a column chunk, each with its line in the batch."""
    b = ColumnsBuilder()
    for _, doc, _ in items:
        b.add(doc)
    return encode_chunk(b, [index[line] for line, _, _ in items])


def _window_update(pk: int, items: list[tuple[int, PatternsDoc, bytes]], n: int, now: float) -> dict[str, Any]:
    opened = [d.window.opened_unix_seconds for _, d, _ in items if d.window.opened_unix_seconds is not None]
    closed = [d.window.closed_unix_seconds for _, d, _ in items if d.window.closed_unix_seconds is not None]
    return {"window": pk, "n": n, "now": now, "opened": min(opened) if opened else None,
            "closed": max(closed) if closed else None}
