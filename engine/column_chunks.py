"""A few ranks' columns as bytes, so a window's documents are parsed once.

The service validates every document of a host's batch as it arrives; while they are parsed it
also lays them out as columns (eroica.engine.columns) and stores them beside the batch as a chunk.
The diagnosis of a 100,000-rank window then merges 12,500 chunks of arrays instead of parsing
100,000 documents again. A chunk carries the line of each of its ranks in the batch, so a
document the engine wants in full is still read from the batch's text.

The format is not pickle (a chunk comes back from a database, and unpickling runs code): zlib of
a 4-byte header length, a JSON header (ranks, lines, keys, texts, array lengths) and the raw
little-endian arrays. A chunk that does not decode is a ValueError; the caller parses the batch's
lines instead.
"""

from __future__ import annotations

import json
import struct
import zlib
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica.engine.columns import FN_FIELDS, SIGNALS, ColumnsBuilder
from eroica.engine.shares import contiguous_shares
from eroica.schema.patterns import Category

VERSION = 2      # 2: each setting's since-step (a chunk of 1 is refused: its batch's lines are parsed instead)
#: the builder's flat arrays and their typecodes ('d': float64, 'q': int64)
_ARRAYS = {"fn_vals": "d", "steps": "d", "step_len": "q", "before": "d", "before_len": "q", "sig": "d",
           "ps_vals": "d", "ps_meta": "q", "ops": "q"}
_PAIRS = ("config", "since", "gaps", "nodes")       # texts that are tuples of pairs


def encode(builder: ColumnsBuilder, lines: list[int]) -> bytes:
    """`builder`'s documents (added in the order of `lines`, each one's line in its batch) as a chunk."""
    if len(lines) != len(builder.ranks):
        raise ValueError(f"{len(lines)} lines for {len(builder.ranks)} ranks")
    builder.seal()
    fn = (np.concatenate(builder.fn_chunks) if builder.fn_chunks else np.zeros((0, len(FN_FIELDS))))
    arrays: list[tuple[str, bytes]] = [(k, getattr(builder, k).tobytes()) for k in _ARRAYS]
    arrays += [(f"scalar:{k}", v.tobytes()) for k, v in builder.scalars.items()]
    arrays.append(("fn", np.ascontiguousarray(fn, dtype="<f8").tobytes()))
    header = {
        "version": VERSION, "ranks": builder.ranks, "lines": lines,
        "keys": [[c.value, name] for c, name in builder.index],
        "op_sets": [sorted(s) for s in builder.op_index],
        "text": builder.text, "arrays": [[k, len(b)] for k, b in arrays]}
    head = json.dumps(header, separators=(",", ":")).encode()
    return zlib.compress(struct.pack("<I", len(head)) + head + b"".join(b for _, b in arrays), 1)


encode_chunk = encode      # its name at the engine's door (eroica.engine)


@dataclass
class Chunk:
    """A decoded chunk: its ranks, their lines in the batch, and its parts as they were written."""

    ranks: list[int]
    lines: list[int]
    keys: list[tuple[Category, str]]
    op_sets: list[frozenset[str]]
    text: dict[str, list[Any]]
    arrays: dict[str, np.ndarray]


def decode(blob: bytes) -> Chunk:
    """A chunk's parts, checked (every index in range); ValueError when it is not one this version wrote."""
    try:
        raw = zlib.decompress(blob)
        (n,) = struct.unpack_from("<I", raw)
        header: dict[str, Any] = json.loads(raw[4:4 + n])
    except (zlib.error, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a column chunk: {exc}") from exc
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise ValueError(f"a column chunk of version {header.get('version') if isinstance(header, dict) else '?'}, "
                         f"this engine reads {VERSION}")
    try:
        chunk = _parts(header, raw, 4 + n)
        _check(chunk)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"a malformed column chunk: {exc!r}") from exc
    return chunk


_TYPES = {"d": "<f8", "q": "<i8"}


def _parts(header: dict[str, Any], raw: bytes, off: int) -> Chunk:
    ranks, lines = [int(r) for r in header["ranks"]], [int(x) for x in header["lines"]]
    arrays: dict[str, np.ndarray] = {}
    for name, size in header["arrays"]:
        code = _ARRAYS.get(name, "d")
        arrays[name] = np.frombuffer(raw, dtype=_TYPES[code], count=int(size) // 8, offset=off)
        off += int(size)
    if off != len(raw):
        raise ValueError(f"{len(raw) - off} bytes past the arrays the header names")
    arrays["fn"] = arrays["fn"].reshape(-1, len(FN_FIELDS))
    arrays["ps_meta"] = arrays["ps_meta"].reshape(-1, 4)
    text = {k: ([tuple(tuple(p) for p in v) for v in vals] if k in _PAIRS else [str(v) for v in vals])
            for k, vals in header["text"].items()}
    return Chunk(ranks, lines, [(_CATEGORY[c], str(name)) for c, name in header["keys"]],
                 [frozenset(x) for x in header["op_sets"]], text, arrays)


_CATEGORY = {c.value: c for c in Category}
_TEXTS = set(ColumnsBuilder().text)
_SCALARS = tuple(ColumnsBuilder().scalars)


def _check(c: Chunk) -> None:
    """Every length and index in range, so a corrupt chunk is refused here, not inside a merge."""
    nr, a = len(c.ranks), c.arrays
    if len(c.lines) != nr or any(len(a[k]) != nr for k in ("step_len", "before_len", "ops")):
        raise ValueError("per-rank arrays differ from the ranks in length")
    if set(c.text) != _TEXTS or any(len(v) != nr for v in c.text.values()):
        raise ValueError("the texts differ from the ranks")
    if any(len(a[f"scalar:{k}"]) != nr for k in _SCALARS):
        raise ValueError("a per-rank scalar differs from the ranks in length")
    if a["step_len"].sum() != len(a["steps"]) or a["before_len"].sum() != len(a["before"]) \
            or len(a["sig"]) != nr * len(SIGNALS):
        raise ValueError("step or signal arrays differ from their lengths")
    if nr and (a["ops"].min() < 0 or a["ops"].max() >= len(c.op_sets)):
        raise ValueError("an operation set out of range")
    fn, meta = a["fn"], a["ps_meta"]
    if len(fn) and (fn[:, 0].min() < 0 or fn[:, 0].max() >= nr or fn[:, 1].min() < 0 or fn[:, 1].max() >= len(c.keys)
                    or fn[:, 2].min() < 0 or (fn[:, 2] + fn[:, 3]).max() > len(a["fn_vals"])):
        raise ValueError("a function row out of range")
    if len(meta) and (meta[:, 0].min() < 0 or meta[:, 0].max() >= nr or meta[:, 3].min() < 0
                      or (meta[:, 2] + meta[:, 3]).max() > len(a["ps_vals"])):
        raise ValueError("a per-step signal out of range")


def assemble(chunks: list[Chunk]) -> ColumnsBuilder:
    """One builder holding every chunk's documents, in order: the arrays joined once, each chunk's
    rows, function keys, operation sets and offsets renumbered with array operations (a window of
    12,500 chunks is not 12,500 merges)."""
    b = ColumnsBuilder()
    if not chunks:
        return b
    nr = np.array([len(c.ranks) for c in chunks], dtype=np.int64)
    row0 = np.concatenate([[0], np.cumsum(nr)[:-1]])
    for k, code in _ARRAYS.items():
        if k not in ("ps_meta", "ops"):
            setattr(b, k, _joined(code, [c.arrays[k] for c in chunks]))
    for k in b.scalars:
        b.scalars[k] = _joined("d", [c.arrays[f"scalar:{k}"] for c in chunks])
    for c in chunks:
        b.ranks += c.ranks
        for k, v in c.text.items():
            b.text[k] += v
    # function rows: row += the chunk's first row, col through the chunk's key map, off += its first value
    cmaps, omaps = [], []
    for c in chunks:
        cmaps.append(np.array([b.index.setdefault(k, len(b.index)) for k in c.keys], dtype=np.int64))
        omaps.append(np.array([b.op_index.setdefault(s, len(b.op_index)) for s in c.op_sets], dtype=np.int64))
    nf = np.array([len(c.arrays["fn"]) for c in chunks], dtype=np.int64)
    fn = np.concatenate([c.arrays["fn"] for c in chunks]).astype(float)
    which = np.repeat(np.arange(len(chunks)), nf)
    key0 = np.concatenate([[0], np.cumsum([len(m) for m in cmaps])[:-1]]).astype(np.int64)
    cmap = np.concatenate(cmaps) if any(len(m) for m in cmaps) else np.zeros(0, dtype=np.int64)
    val0 = np.concatenate([[0], np.cumsum([len(c.arrays["fn_vals"]) for c in chunks])[:-1]])
    if len(fn):
        fn[:, 0] += row0[which]
        fn[:, 1] = cmap[key0[which] + fn[:, 1].astype(np.int64)]
        fn[:, 2] += val0[which]
    b.fn_chunks = [fn] if len(fn) else []
    op0 = np.concatenate([[0], np.cumsum([len(m) for m in omaps])[:-1]]).astype(np.int64)
    omap = np.concatenate(omaps)
    ops = np.concatenate([c.arrays["ops"] for c in chunks]) + np.repeat(op0, nr)
    b.ops = _joined("q", [omap[ops]])
    meta = np.concatenate([c.arrays["ps_meta"] for c in chunks]).copy()
    if len(meta):
        nm = np.array([len(c.arrays["ps_meta"]) for c in chunks], dtype=np.int64)
        ps0 = np.concatenate([[0], np.cumsum([len(c.arrays["ps_vals"]) for c in chunks])[:-1]])
        meta[:, 0] += np.repeat(row0, nm)
        meta[:, 3] += np.repeat(ps0, nm)
    b.ps_meta = _joined("q", [meta.ravel()])
    return b


def _joined(code: str, parts: list[np.ndarray]) -> array[Any]:
    out = array(code)
    out.frombytes(np.ascontiguousarray(np.concatenate(parts), dtype=_TYPES[code]).tobytes())
    return out


@dataclass
class WindowChunks:
    """A window's chunks, decoded: their columns in one builder, where each document is (pack, its
    ranks, their lines), and the packs that still need parsing (no chunk, or one that did not
    decode or does not hold exactly the lines wanted)."""

    columns: ColumnsBuilder
    placed: list[tuple[int, list[int], list[int]]]
    rest: list[tuple[int, list[int]]]


PARALLEL_MIN_CHUNK_BYTES = 4 << 20     # stored chunk bytes below which one process decodes a window's chunks
_SHARED: Mapping[int, bytes] = {}       # a forked decoder's view of the chunks (never pickled)


def window_chunks(items: list[tuple[int, list[int]]], chunks: Mapping[int, bytes], workers: int = 1) -> WindowChunks:
    """Decode the chunks of the packs in `items` ((pack, wanted lines), in pack order); `workers` > 1:
    a wide window's chunks are decoded in that many processes (forked; this one is one of them)."""
    if not chunks:
        return WindowChunks(ColumnsBuilder(), [], list(items))
    total = sum(len(chunks[p]) for p, _ in items if p in chunks)
    if workers < 2 or total < PARALLEL_MIN_CHUNK_BYTES or len(items) < 2 * workers:
        return _decode_share(items, chunks)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = contiguous_shares(items, [len(chunks.get(p, b"")) for p, _ in items], workers)
    with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork"),
                             initializer=_share, initargs=(chunks,)) as pool:
        futures = [pool.submit(_decode_forked, share) for share in shares[1:]]
        out = _decode_share(shares[0], chunks)
        for fut in futures:
            part = fut.result()
            out.columns.merge(part.columns)
            out.placed += part.placed
            out.rest += part.rest
    return out


def _share(chunks: Mapping[int, bytes]) -> None:
    global _SHARED
    _SHARED = chunks


def _decode_forked(items: list[tuple[int, list[int]]]) -> WindowChunks:
    return _decode_share(items, _SHARED)


def _decode_share(items: list[tuple[int, list[int]]], chunks: Mapping[int, bytes]) -> WindowChunks:
    ready: list[tuple[int, Chunk]] = []
    rest: list[tuple[int, list[int]]] = []
    for p, lines in items:
        blob = chunks.get(p)
        if blob is not None and lines:
            try:
                chunk: Chunk | None = decode(blob)
            except ValueError:
                chunk = None
            if chunk is not None and sorted(chunk.lines) == sorted(lines) and len(set(lines)) == len(lines):
                ready.append((p, chunk))
                continue
        rest.append((p, lines))
    return WindowChunks(assemble([c for _, c in ready]).seal(), [(p, c.ranks, c.lines) for p, c in ready], rest)
