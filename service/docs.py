"""Reading stored documents back: each is either its own gzip'd body (uploaded alone) or a line of a
stored batch (a host's ranks, uploaded together and kept as they came). The diagnosis worker gets
them as packs (gzip'd bodies, each read once) and each rank's place in them, so a 100,000-rank
window crosses to the worker as compressed bytes and is decompressed there, a pack at a time."""

from __future__ import annotations

import sqlalchemy as sa

from eroica.engine.load import pack_lines
from eroica.service.db import batches, documents


def window_packs(c: sa.Connection, window_pk: int, ranks: list[int] | None = None
                 ) -> tuple[list[bytes], list[tuple[int, int]], list[int]]:
    """The window's documents (of `ranks`, or all): the packs (gzip'd), each document's (pack index,
    line), and its rank, in rank order."""
    q = sa.select(documents.c.rank, documents.c.body, documents.c.batch_pk, documents.c.line).where(
        documents.c.window_pk == window_pk)
    if ranks is not None:
        q = q.where(documents.c.rank.in_(ranks))
    rows = c.execute(q.order_by(documents.c.rank)).all()
    packs = [r.body for r in rows if r.body is not None]
    wanted = sorted({r.batch_pk for r in rows if r.body is None})
    at: dict[int, int] = {}
    for i in range(0, len(wanted), 500):
        for pk, body in c.execute(sa.select(batches.c.pk, batches.c.body).where(batches.c.pk.in_(wanted[i:i + 500]))):
            at[pk] = len(packs)
            packs.append(body)
    alone = iter(range(len(packs)))
    refs = [(next(alone), 0) if r.body is not None else (at[r.batch_pk], r.line) for r in rows]
    return packs, refs, [r.rank for r in rows]


def doc_texts(c: sa.Connection, window_pk: int, ranks: list[int] | None = None) -> dict[int, bytes]:
    """The window's documents (of `ranks`, or all) as JSON text, by rank."""
    packs, refs, order = window_packs(c, window_pk, ranks)
    lines: dict[int, list[bytes]] = {}
    out: dict[int, bytes] = {}
    for rank, (p, line) in zip(order, refs):
        if p not in lines:
            lines[p] = pack_lines(packs[p])
        out[rank] = lines[p][line]
    return out
