"""Reading stored documents back: each is either its own gzip'd body (uploaded alone) or a line of a
stored batch (a host's ranks, uploaded together and kept as they came). The diagnosis worker gets
them as packs (gzip'd bodies, each read once) and each rank's place in them, so a 100,000-rank
window crosses to the worker as compressed bytes and is decompressed there, a pack at a time."""

from __future__ import annotations

import gzip

import sqlalchemy as sa

from eroica.service.db import batches, documents


def window_packs(c: sa.Connection, window_pk: int, ranks: list[int] | None = None
                 ) -> tuple[list[bytes], list[tuple[int, int]]]:
    """The window's documents (of `ranks`, or all), by rank: the packs (gzip'd) and, per document,
    (pack index, line) in rank order."""
    q = sa.select(documents.c.rank, documents.c.body, documents.c.batch_pk, documents.c.line).where(
        documents.c.window_pk == window_pk)
    if ranks is not None:
        q = q.where(documents.c.rank.in_(ranks))
    packs: list[bytes] = []
    refs: list[tuple[int, int]] = []
    batch_index: dict[int, int] = {}
    want: list[int] = []
    for row in c.execute(q.order_by(documents.c.rank)):
        if row.body is not None:
            packs.append(row.body)
            refs.append((len(packs) - 1, 0))
        else:
            if row.batch_pk not in batch_index:
                batch_index[row.batch_pk] = -1
                want.append(row.batch_pk)
            refs.append((-1 - row.batch_pk, row.line))      # resolved below
    for i in range(0, len(want), 500):
        for pk, body in c.execute(sa.select(batches.c.pk, batches.c.body).where(batches.c.pk.in_(want[i:i + 500]))):
            packs.append(body)
            batch_index[pk] = len(packs) - 1
    return packs, [(p if p >= 0 else batch_index[-1 - p], line) for p, line in refs]


def doc_texts(c: sa.Connection, window_pk: int, ranks: list[int] | None = None) -> dict[int, bytes]:
    """The window's documents (of `ranks`, or all) as JSON text, by rank."""
    ranks_q = sa.select(documents.c.rank).where(documents.c.window_pk == window_pk)
    if ranks is not None:
        ranks_q = ranks_q.where(documents.c.rank.in_(ranks))
    order = list(c.execute(ranks_q.order_by(documents.c.rank)).scalars())
    packs, refs = window_packs(c, window_pk, ranks)
    lines: dict[int, list[bytes]] = {}
    out: dict[int, bytes] = {}
    for rank, (p, line) in zip(order, refs):
        if p not in lines:
            lines[p] = unpack(packs[p])
        out[rank] = lines[p][line]
    return out


def unpack(pack: bytes) -> list[bytes]:
    """A pack's documents: its lines (a document alone is a pack of one line)."""
    text = gzip.decompress(pack) if pack[:2] == b"\x1f\x8b" else pack
    return [ln for ln in text.split(b"\n") if ln.strip()]
