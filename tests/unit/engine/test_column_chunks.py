"""A batch's documents laid out as columns when they were validated (eroica.engine.column_chunks):
the window built from the chunks is the window parsed from the documents, field by field, and the
same diagnosis; a chunk that does not decode, does not hold the lines wanted or repeats a rank is
parsed instead, so nothing is lost and a duplicate is still named."""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from pathlib import Path

import numpy as np
import pytest

import eroica.engine.column_chunks as cc
from eroica.engine.column_chunks import decode, encode
from eroica.engine.columns import ColumnsBuilder, WindowColumns
from eroica.engine.load import pack_lines, parse_doc, window_of_packs
from eroica.engine.pipeline import DiagnoseOptions, diagnose_documents
from eroica.lab.simulate import simulate


def host_packs(tmp: Path, ranks: int = 160) -> tuple[list[bytes], list[bytes]]:
    """The hosts' packs (gzip'd) and the chunk the service builds of each (every line, in order)."""
    simulate(tmp / "sim", ranks, "gpu_throttled", seed=3, tp=8, pp=5, packed=True)
    texts = [f.read_bytes() for f in sorted((tmp / "sim").rglob("host-*.jsonl"))]
    chunks = []
    for t in texts:
        b = ColumnsBuilder()
        lines = pack_lines(t)
        for line in lines:
            b.add(parse_doc(line, "test", one_line=True))
        chunks.append(encode(b, list(range(len(lines)))))
    return [gzip.compress(t, 1) for t in texts], chunks


def refs(packs: list[bytes]) -> list[tuple[int, int]]:
    return [(p, i) for p, pack in enumerate(packs) for i in range(len(pack_lines(pack)))]


def same(a: WindowColumns, b: WindowColumns) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        elif isinstance(x, dict) and x and isinstance(next(iter(x.values())), np.ndarray):
            assert x.keys() == y.keys(), f.name
            for k in x:
                assert np.array_equal(x[k], y[k], equal_nan=True), (f.name, k)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("workers", [1, 2])
def test_a_window_from_chunks_is_the_window_parsed_and_diagnosed_the_same(tmp_path: Path, workers: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    packs, chunks = host_packs(tmp_path)
    monkeypatch.setattr(cc, "PARALLEL_MIN_CHUNK_BYTES", 1)        # two processes decode even this small window
    parsed = window_of_packs("w000-s200", packs, refs(packs))
    chunked = window_of_packs("w000-s200", packs, refs(packs), chunks=dict(enumerate(chunks)), workers=workers)
    same(parsed.columns, chunked.columns)
    assert chunked.problems == [] and sorted(chunked.docs) == list(range(160))
    assert chunked.docs[157].model_dump() == parsed.docs[157].model_dump()   # the text is still there to read
    d1, d2 = (diagnose_documents([w], opts=DiagnoseOptions(in_process=True), run="r") for w in (parsed, chunked))
    assert d1.model_dump() == d2.model_dump() and d1.windows[0].findings


def test_a_chunk_that_does_not_decode_or_hold_the_wanted_lines_is_parsed_instead(tmp_path: Path) -> None:
    packs, chunks = host_packs(tmp_path, 80)
    parsed = window_of_packs("w", packs, refs(packs))
    raw = zlib.decompress(chunks[2])
    broken = {
        0: b"not a chunk",
        1: chunks[1][: len(chunks[1]) // 2],                       # truncated
        2: zlib.compress(raw[:-8]),                                # an array shorter than its header says
        3: chunks[4],                                              # another host's chunk: not these lines' ranks
        4: chunks[4],
    }
    got = window_of_packs("w", packs, refs(packs), chunks=broken)
    # chunk 3 holds host 4's lines 0..7, which pack 3 also has: its ranks would repeat pack 4's, so
    # the chunked packs are parsed and every rank is its own document's
    same(parsed.columns, got.columns)
    assert got.problems == []
    for blob in list(broken.values())[:3]:
        with pytest.raises(ValueError):
            decode(blob)


def test_a_rank_twice_is_named_as_when_parsing(tmp_path: Path) -> None:
    packs, chunks = host_packs(tmp_path, 80)
    again = [*packs, packs[0]]
    got = window_of_packs("w", again, refs(again), chunks={0: chunks[0], 1: chunks[1], 2: chunks[0]})
    assert sorted(got.docs) == list(range(80))
    assert any(p.field == "job.rank" and "duplicate rank" in p.message for p in got.problems)


def test_a_chunk_is_compact_and_carries_no_code(tmp_path: Path) -> None:
    """A chunk comes back from a database: it is data (JSON and raw arrays), not a pickle; and it is
    about the size of the gzip'd documents it stands for."""
    packs, chunks = host_packs(tmp_path, 80)
    raw = zlib.decompress(chunks[0])
    assert b"\x80\x04" not in raw[:2] and raw[4:5] == b"{"
    assert sum(map(len, chunks)) < 2 * sum(map(len, packs))
