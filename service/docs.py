"""Reading stored documents back: each is either its own gzip'd body (uploaded alone) or a line of a
stored batch (a host's ranks, uploaded together and kept as they came). The diagnosis worker gets
them as packs (gzip'd bodies) and each rank's place in them, and, for a batch whose documents were
laid out as columns when it was validated, those columns instead of its body: the worker reads
such a batch's text from the database only for the few documents the engine wants in full
(`StoredPacks`), so a 100,000-rank window crosses to the worker as its columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

import sqlalchemy as sa

from eroica.engine import pack_lines
from eroica.service.db import batch_columns, batches, documents


@dataclass
class WindowPacks:
    packs: list[bytes | None]          # gzip'd: a batch's body, or a document that came alone (None: not read)
    refs: list[tuple[int, int]]        # each document's (pack index, line), in rank order
    ranks: list[int]
    chunks: dict[int, bytes] = field(default_factory=dict)   # pack index -> its columns for this window
    unread: dict[int, int] = field(default_factory=dict)     # pack index -> batch pk, of the packs not read


def window_packs(c: sa.Connection, window_pk: int, ranks: list[int] | None = None,
                 with_chunks: bool = False) -> WindowPacks:
    """The window's documents (of `ranks`, or all). With `with_chunks`, the column chunks kept for
    its batches (eroica.engine.column_chunks), and those batches' bodies are not read (`unread`)."""
    q = sa.select(documents.c.rank, documents.c.body, documents.c.batch_pk, documents.c.line).where(
        documents.c.window_pk == window_pk)
    if ranks is not None:
        q = q.where(documents.c.rank.in_(ranks))
    rows = c.execute(q.order_by(documents.c.rank)).all()
    packs: list[bytes | None] = [r.body for r in rows if r.body is not None]
    wanted = sorted({r.batch_pk for r in rows if r.body is None})
    have = dict(c.execute(sa.select(batch_columns.c.batch_pk, batch_columns.c.body).where(
        batch_columns.c.window_pk == window_pk)).all()) if with_chunks else {}
    at: dict[int, int] = {}
    for pk in wanted:
        at[pk] = len(packs)
        packs.append(None)
    unread = {at[pk]: pk for pk in wanted if pk in have}
    read = [pk for pk in wanted if pk not in have]
    for i in range(0, len(read), 500):
        for pk, body in c.execute(sa.select(batches.c.pk, batches.c.body).where(batches.c.pk.in_(read[i:i + 500]))):
            packs[at[pk]] = body
    alone = iter(range(len(packs)))
    refs = [(next(alone), 0) if r.body is not None else (at[r.batch_pk], r.line) for r in rows]
    return WindowPacks(packs, refs, [r.rank for r in rows], {at[pk]: have[pk] for pk in unread.values()}, unread)


class StoredPacks(Sequence[bytes]):
    """A window's packs in the diagnosis worker: those sent along, and the batches left `unread`,
    read from the database (`db_url`) the first time one of their documents is wanted, then kept.
    No connection is kept between reads (the engine may fork parsers, which must not share one)."""

    def __init__(self, packs: list[bytes | None], unread: dict[int, int], db_url: str) -> None:
        self._packs, self._unread, self._url = list(packs), unread, db_url

    def __len__(self) -> int:
        return len(self._packs)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        body = self._packs[i]
        if body is None:
            from eroica.service.db import make_engine, reading

            eng = make_engine(self._url)
            try:
                with reading(eng) as c:
                    body = c.execute(sa.select(batches.c.body).where(batches.c.pk == self._unread[i])).scalar_one()
            finally:
                eng.dispose()
            self._packs[i] = body
        return body


def doc_texts(c: sa.Connection, window_pk: int, ranks: list[int] | None = None) -> dict[int, bytes]:
    """The window's documents (of `ranks`, or all) as JSON text, by rank."""
    wp = window_packs(c, window_pk, ranks)
    lines: dict[int, list[bytes]] = {}
    out: dict[int, bytes] = {}
    for rank, (p, line) in zip(wp.ranks, wp.refs):
        if p not in lines:
            body = wp.packs[p]
            assert body is not None           # read without chunks: every pack is read
            lines[p] = pack_lines(body)
        out[rank] = lines[p][line]
    return out
