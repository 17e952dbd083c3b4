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

from eroica.engine import ColumnsBuilder, encode_chunk
from eroica.schema.patterns import PatternsDoc
from eroica.service.db import batch_columns, batches, documents, windows, writing
from eroica.service.errors import Conflict, Invalid, Malformed, TooLarge
from eroica.service.runs import touch_run, valid_job_id

MAX_LINES = 4096          # documents per batch (a host has at most a few dozen ranks)
Items = list[tuple[int, PatternsDoc, bytes]]      # (line, document, its JSON text)


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


@dataclass(frozen=True)
class Prepared:
    """One upload, checked and laid out before any transaction: its documents by window, its body to
    keep, each window's column chunk and each document's hash (the CPU work of storing it)."""

    job_id: str
    name: str | None
    alone: bool                  # one document uploaded by itself, kept in its own row (no batch row)
    world: int
    by_window: dict[str, Items]
    index: dict[int, int]        # a document's line: its index among the batch's
    packed: bytes | None         # the batch's body, gzip'd (None when alone)
    chunks: dict[str, bytes]     # a window's documents of this batch as columns (none when alone)
    sha256: dict[int, str]       # a document's line: the hash of its text
    keys: frozenset[tuple[str, str, int]]   # (job, window, rank) of every document

    @property
    def size(self) -> int:
        return len(self.index)

    def where(self, line: int) -> str:
        return _line_prefix(self.alone, line)


def _line_prefix(alone: bool, line: int) -> str:
    """How a refusal names a document: by its line in a batch; nothing for one uploaded alone."""
    return "" if alone else f"line {line}: "


def prepare(job_id: str, docs: Items, name: str | None = None,
            packed: bytes | None = None, alone: bool = False) -> Prepared:
    """Check a batch of (line, document, its JSON text) of run `job_id` (one world, each rank once per
    window, every rank inside the world; refused naming the line) and lay it out for `write`.
    `packed`: the whole body gzip'd, when it came so (its non-empty lines are `docs`, in order), kept as
    is. `alone`: one document uploaded by itself."""
    valid_job_id(job_id)
    world = docs[0][1].job.world_size
    by_window: dict[str, Items] = defaultdict(list)
    seen: dict[tuple[str, int], int] = {}

    def where(line: int) -> str:
        return _line_prefix(alone, line)
    for line, doc, _ in docs:
        if doc.job.world_size != world:
            raise Invalid(f"{where(line)}world size {doc.job.world_size}, line {docs[0][0]} says {world}",
                          "job.world_size")
        if doc.job.rank >= world:
            raise Invalid(f"{where(line)}rank {doc.job.rank} is outside the job's world of {world}", "job.rank")
        key = (doc.window.window_id, doc.job.rank)
        if key in seen:
            raise Invalid(f"{where(line)}rank {doc.job.rank} of window {key[0]} again (line {seen[key]})", "job.rank")
        seen[key] = line
    for item in docs:
        by_window[item[1].window.window_id].append(item)
    index = {line: i for i, (line, _, _) in enumerate(docs)}
    if not alone and packed is None:
        packed = gzip.compress(b"".join(text.strip() + b"\n" for _, _, text in docs), 1)
    # built before the transaction; kept only where every document of the window is stored now
    chunks = {} if alone else {wid: _chunk(items, index) for wid, items in by_window.items()}
    return Prepared(job_id, name, alone, world, dict(by_window), index, None if alone else packed, chunks,
                    {line: hashlib.sha256(text.strip()).hexdigest() for line, _, text in docs},
                    frozenset((job_id, wid, r) for wid, r in seen))


def ingest_many(eng: sa.Engine, job_id: str, docs: Items, now: float | None = None,
                name: str | None = None, packed: bytes | None = None, alone: bool = False) -> BulkIngested:
    """Store a batch of (line, document, its JSON text) of run `job_id` in one transaction (`prepare`
    says what is checked and what `packed` and `alone` mean)."""
    return write(eng, [prepare(job_id, docs, name, packed, alone)], now)[0]


def write(eng: sa.Engine, group: list[Prepared], now: float | None = None) -> list[BulkIngested]:
    """Store prepared uploads in one transaction, all or nothing (a refusal of any refuses them all:
    eroica.service.group_commit then stores each alone). No two of them may hold a document of the
    same rank of the same window. Every lock is taken in one order (runs and hosts, then documents
    and windows by key), so two such transactions never deadlock."""
    if len(frozenset().union(*(g.keys for g in group))) != sum(len(g.keys) for g in group):
        raise ValueError("two uploads of one group hold a document of the same rank of the same window")
    now = time.time() if now is None else now
    st = _statements(eng.dialect.name)
    with writing(eng) as c:
        batched = [g for g in group if not g.alone]
        batch_pk: dict[int, int] = {}
        if batched:
            got = c.execute(st.batch, [{"body": g.packed, "received_at": now} for g in batched]).scalars().all()
            batch_pk = {id(g): pk for g, pk in zip(batched, got, strict=True)}
        for job_id, name, world, host in sorted({(g.job_id, g.name or "", g.world, d.job.hostname)
                                                 for g in group for items in g.by_window.values()
                                                 for _, d, _ in items}):
            touch_run(c, job_id, name or None, world, host, now, "job.world_size")
        window_pk: dict[tuple[str, str], int] = {}
        for job_id, wid in sorted({(g.job_id, wid) for g in group for wid in g.by_window}):
            pk = c.execute(st.window, {"job": job_id, "wid": wid}).scalar()
            if pk is None:             # the window's first documents (or another replica's, at the same moment)
                first = next(g for g in group if g.job_id == job_id and wid in g.by_window)
                win = first.by_window[wid][0][1].window
                c.execute(st.new_window, {
                    "job_id": job_id, "window_id": wid, "world_size": first.world, "start_step": win.start_step,
                    "end_step": win.end_step, "trigger": win.trigger, "status": "collecting", "ranks_reported": 0,
                    "first_doc_at": now, "last_doc_at": now, "attempts": 0})
                pk = c.execute(st.window, {"job": job_id, "wid": wid}).scalar_one()
            window_pk[(job_id, wid)] = pk
        rows = sorted(({"window_pk": window_pk[(g.job_id, wid)], "rank": doc.job.rank, "sha256": g.sha256[line],
                        "body": gzip.compress(text, 1) if g.alone else None, "batch_pk": batch_pk.get(id(g)),
                        "line": None if g.alone else g.index[line], "host": doc.job.hostname, "received_at": now}
                       for g in group for wid, items in g.by_window.items() for line, doc, text in items),
                      key=lambda r: (r["window_pk"], r["rank"]))
        stored = _insert_documents(c, st, rows)
        out: list[BulkIngested] = []
        chunk_rows: list[dict[str, Any]] = []
        updates: dict[int, list[tuple[Items, int]]] = defaultdict(list)
        for g in group:
            created = existing = 0
            pks = []
            for wid, items in g.by_window.items():
                pk = window_pk[(g.job_id, wid)]
                pks.append(pk)
                again = [(line, doc) for line, doc, _ in items if (pk, doc.job.rank) not in stored]
                if again:
                    _refuse_different(c, g, wid, pk, again)
                if id(g) in batch_pk and not again:
                    chunk_rows.append({"window_pk": pk, "batch_pk": batch_pk[id(g)], "body": g.chunks[wid]})
                created += len(items) - len(again)
                existing += len(again)
                if len(items) > len(again):
                    updates[pk].append((items, len(items) - len(again)))
            out.append(BulkIngested(created, existing, pks))
        if chunk_rows:
            c.execute(st.chunk, chunk_rows)
        for pk in sorted(updates):     # the window's row is locked here, by this one statement, until commit
            c.execute(st.window_update, _window_update(pk, updates[pk], now))
        unused = [batch_pk[id(g)] for g, r in zip(group, out, strict=True) if id(g) in batch_pk and not r.created]
        if unused:                     # all of it was here already: keep nothing of this copy
            c.execute(batches.delete().where(batches.c.pk.in_(unused)))
    return out


#: PostgreSQL: the group's documents as one array per column, unnested (one short statement however many
#: rows: the driver caches and prepares it, where a multi-row VALUES list is parsed again every time)
_DOCUMENT_COLUMNS = {"window_pk": "integer", "rank": "integer", "sha256": "varchar", "body": "bytea",
                     "batch_pk": "integer", "line": "integer", "host": "varchar", "received_at": "float8"}
_PG_DOCUMENTS = (
    f"INSERT INTO documents ({', '.join(_DOCUMENT_COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in _DOCUMENT_COLUMNS.values())}) "
    "ON CONFLICT (window_pk, rank) DO NOTHING RETURNING window_pk, rank")


def _insert_documents(c: sa.Connection, st: _Statements, rows: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """Insert the rows a document does not have yet; the (window, rank) of those stored now."""
    if c.dialect.name == "postgresql":
        return {(pk, r) for pk, r in c.exec_driver_sql(
            _PG_DOCUMENTS, tuple([row[k] for row in rows] for k in _DOCUMENT_COLUMNS))}
    # executemany: one compiled statement, sent as multi-row INSERTs (SQLAlchemy's insertmanyvalues)
    return {(pk, r) for pk, r in c.execute(st.documents, rows)}


def _refuse_different(c: sa.Connection, g: Prepared, wid: str, pk: int, again: list[tuple[int, PatternsDoc]]) -> None:
    """A rank stored already must be stored with the same document (a re-upload), else 409."""
    old = {r: h for r, h in c.execute(sa.select(documents.c.rank, documents.c.sha256).where(
        documents.c.window_pk == pk, documents.c.rank.in_([d.job.rank for _, d in again])))}
    for line, doc in again:
        r = doc.job.rank
        if r in old and old[r] != g.sha256[line]:
            raise Conflict(f"{g.where(line)}window {wid} already has a different document for rank {r}"
                           + ("" if g.alone else "; nothing of this batch was stored"), "job.rank")


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
        batch=batches.insert().returning(batches.c.pk, sort_by_parameter_order=True),
        window=sa.select(w.pk).where(w.job_id == sa.bindparam("job"), w.window_id == sa.bindparam("wid")),
        new_window=dialect.insert(windows).on_conflict_do_nothing(index_elements=["job_id", "window_id"]),
        documents=(dialect.insert(documents).on_conflict_do_nothing(index_elements=["window_pk", "rank"])
                   .returning(documents.c.window_pk, documents.c.rank)),
        window_update=update,
        chunk=batch_columns.insert(),
    )


def _chunk(items: Items, index: dict[int, int]) -> bytes:
    """A window's documents of one batch as a column chunk, each with its line in the batch."""
    b = ColumnsBuilder()
    for _, doc, _ in items:
        b.add(doc)
    return encode_chunk(b, [index[line] for line, _, _ in items])


def _window_update(pk: int, parts: list[tuple[Items, int]], now: float) -> dict[str, Any]:
    """The window's row update for its documents stored now (`parts`: each upload's, with how many were new)."""
    docs = [d for items, _ in parts for _, d, _ in items]
    opened = [d.window.opened_unix_seconds for d in docs if d.window.opened_unix_seconds is not None]
    closed = [d.window.closed_unix_seconds for d in docs if d.window.closed_unix_seconds is not None]
    return {"window": pk, "n": sum(n for _, n in parts), "now": now, "opened": min(opened) if opened else None,
            "closed": max(closed) if closed else None}
