"""Read a run directory: `RUN_DIR/<window>/rank-<R>.json` -> validated pattern documents per window.

A file that cannot be read or validated is reported with its path and the failing field, and
the other ranks are still diagnosed.
"""

from __future__ import annotations

import gzip
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from eroica.engine.column_chunks import WindowChunks, window_chunks
from eroica.engine.columns import ColumnsBuilder, WindowColumns, window_columns
from eroica.engine.errors import RunDirError
from eroica.engine.heap import held_off
from eroica.engine.shares import contiguous_shares
from eroica.schema.files import PACKED_FILE, RANK_FILE, TRACE_FILE, is_pattern_file
from eroica.schema.patterns import PATTERNS_SCHEMA, PatternsDoc


@dataclass(frozen=True)
class LoadProblem:
    path: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.path}{where}: {self.message}"


class DocStore(Mapping[int, PatternsDoc]):
    """A window's documents by rank, read again from their file when asked for and not cached.

    Loading validates every document once and keeps its numbers as columns (engine/columns.py);
    the documents themselves are kept only up to `cache_limit`, so a wide window costs arrays, not
    object trees. Reading a document again finds it where it was loaded from (file and byte offset)."""

    def __init__(self, cache_limit: int = 4096) -> None:
        self._where: dict[int, tuple[str, int, int]] = {}     # rank -> (path, offset, length; -1: whole file)
        self._cache: OrderedDict[int, PatternsDoc] = OrderedDict()
        self.cache_limit = cache_limit

    def add(self, rank: int, where: tuple[str, int, int], doc: PatternsDoc | None) -> None:
        self._where[rank] = where
        if doc is not None and len(self._cache) < self.cache_limit:
            self._cache[rank] = doc

    def __getitem__(self, rank: int) -> PatternsDoc:
        doc = self._cache.get(rank)
        if doc is not None:
            self._cache.move_to_end(rank)
            return doc
        doc = self._read(rank)
        self._cache[rank] = doc
        if len(self._cache) > self.cache_limit:
            self._cache.popitem(last=False)
        return doc

    def _read(self, rank: int) -> PatternsDoc:
        path, off, length = self._where[rank]
        with open(path, "rb") as fh:
            fh.seek(off)
            text = fh.read() if length < 0 else fh.read(length)
        doc = parse_doc(text, path if length < 0 else f"{path}@{off}")
        if doc.job.rank != rank:
            raise RunDirError(f"changed since it was loaded: rank {doc.job.rank} where rank {rank} was", path=path)
        return doc

    def __contains__(self, rank: object) -> bool:
        return rank in self._where

    def __iter__(self) -> Iterator[int]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


@dataclass
class WindowData:
    """One window's documents (`docs`: a dict, or a DocStore when loaded from a run directory) and
    their columns (built from `docs` when not given)."""

    window_id: str
    docs: Mapping[int, PatternsDoc]
    problems: list[LoadProblem] = field(default_factory=list)
    raw_traces: dict[int, str] = field(default_factory=dict)    # rank -> bounded raw trace, when kept
    _columns: WindowColumns | None = None

    @property
    def columns(self) -> WindowColumns:
        if self._columns is None:
            self._columns = window_columns(self.docs[r] for r in sorted(self.docs))
        return self._columns

    @property
    def world_size(self) -> int:
        sizes = self.columns.world_size
        return int(sizes.max()) if len(sizes) else 0


class BlobStore(DocStore):
    """A window's documents held as packs (JSON text, gzip'd or not, one document per line) and
    parsed again from them when asked for: the service's worker keeps a 100,000-rank window as
    compressed bytes and columns, not object trees. `add` takes (pack, line, name) as where."""

    def __init__(self, packs: Sequence[bytes] = (), cache_limit: int = 4096) -> None:
        super().__init__(cache_limit)
        self.packs = packs

    def _read(self, rank: int) -> PatternsDoc:
        pack, line, name = self._where[rank]
        return parse_doc(pack_lines(self.packs[int(pack)])[line], str(name), one_line=True)


def pack_lines(pack: bytes) -> list[bytes]:
    """A pack's documents: its non-empty lines (a document alone is a pack of one line)."""
    text = gzip.decompress(pack) if pack[:2] == b"\x1f\x8b" else pack
    return [ln for ln in text.split(b"\n") if ln.strip()]


def window_of_packs(window_id: str, packs: Sequence[bytes], refs: Sequence[tuple[int, int]] | None = None,
                    cache_limit: int = 4096, workers: int = 1, chunks: Mapping[int, bytes] | None = None
                    ) -> WindowData:
    """A window of documents as JSON text: `packs` (gzip'd or not, one document per line) and the
    (pack, line) of each document (None: every line of every pack). Each is parsed and validated
    once into columns and kept as text (a pack is decompressed once here, and again only when a
    document that left the cache is read). The engine's document entry point takes these; a line
    that does not parse, or a second document for a rank, is a problem of the window, named by its
    pack and line; the others are still diagnosed. `workers` > 1: a wide window's packs are parsed
    in that many processes (forked; this one is one of them) and their columns merged in pack order.
    `chunks`: a pack's columns already built when it was validated (eroica.engine.column_chunks), by
    pack index: those packs are not parsed again unless the chunk does not cover their wanted lines."""
    wanted: dict[int, list[int]] = {}
    if refs is None:
        wanted = {p: [] for p in range(len(packs))}        # [] : all lines
    else:
        for p, line in refs:
            wanted.setdefault(p, []).append(line)
    with held_off():
        ready = window_chunks(sorted(wanted.items()), chunks or {}, workers)
    items = ready.rest
    total = sum(len(packs[p]) for p, _ in items)
    got = None
    if workers > 1 and total >= PARALLEL_MIN_PACK_BYTES and len(items) >= workers:
        got = _packs_parallel(window_id, packs, items, cache_limit, workers)
    if got is None:
        w = WindowData(window_id=window_id, docs=BlobStore(packs, cache_limit))
        builder = ColumnsBuilder()
        with held_off():     # many objects, no cycles
            _load_packs(w, packs, items, builder)
    else:
        w, builder = got
    with held_off():
        builder = _add_chunks(w, packs, builder, ready)
        w._columns = builder.build()
    return w


def _add_chunks(w: WindowData, packs: Sequence[bytes], builder: ColumnsBuilder, ready: WindowChunks
                ) -> ColumnsBuilder:
    """`builder` with the decoded chunks' columns, their documents added to `w`; when a rank appears
    twice (in two chunks, or in a pack parsed here) the chunks' packs are parsed instead, so the
    duplicate is named as when parsing."""
    store = w.docs
    assert isinstance(store, DocStore)
    ranks = [r for _, rs, _ in ready.placed for r in rs]
    if len(set(ranks)) != len(ranks) or any(r in store for r in ranks):
        _load_packs(w, packs, [(p, lines) for p, _, lines in ready.placed], builder)
        return builder
    for p, rs, lines in ready.placed:
        for r, line in zip(rs, lines):
            store.add(r, (p, line, f"{w.window_id}/pack {p}:{line + 1}"), None)   # type: ignore[arg-type]
    if not builder.ranks:          # nothing was parsed: the chunks are the window
        return ready.columns
    builder.merge(ready.columns)
    return builder


PARALLEL_MIN_PACK_BYTES = 4 << 20     # stored (compressed) bytes below which one process parses a window


def _load_packs(w: WindowData, packs: Sequence[bytes], items: list[tuple[int, list[int]]],
                builder: ColumnsBuilder) -> None:
    store = w.docs
    assert isinstance(store, DocStore)
    window_id = w.window_id
    for p, lines_wanted in items:
        try:
            lines = pack_lines(packs[p])
        except (OSError, EOFError, IndexError) as exc:
            w.problems.append(LoadProblem(f"{window_id}/pack {p}", "", f"cannot read: {exc!r}"))
            continue
        for line in lines_wanted or range(len(lines)):
            where = f"{window_id}/pack {p}:{line + 1}"
            if line >= len(lines):
                w.problems.append(LoadProblem(where, "", "no such line"))
                continue
            doc = _parse_or_report(w, lambda: lines[line], where, one_line=True)  # noqa: B023
            if doc is None:
                continue
            if doc.job.rank in store:
                w.problems.append(LoadProblem(where, "job.rank", f"duplicate rank {doc.job.rank}; first one kept"))
                continue
            store.add(doc.job.rank, (p, line, where), doc)     # type: ignore[arg-type]
            builder.add(doc)


_SHARED_PACKS: Sequence[bytes] = ()     # a forked parser's view of the window's packs (never pickled)


def _share_packs(packs: Sequence[bytes]) -> None:
    global _SHARED_PACKS
    _SHARED_PACKS = packs


def _packs_part(window_id: str, items: list[tuple[int, list[int]]]) -> tuple[ColumnsBuilder, WindowData]:
    w = WindowData(window_id=window_id, docs=BlobStore(_SHARED_PACKS, 0))
    builder = ColumnsBuilder()
    with held_off():
        _load_packs(w, _SHARED_PACKS, items, builder)
    return builder.seal(), w


def _packs_parallel(window_id: str, packs: Sequence[bytes], items: list[tuple[int, list[int]]], cache_limit: int,
                    workers: int) -> tuple[WindowData, ColumnsBuilder] | None:
    """The window and its columns, not yet built; None when a rank appears in two shares (the
    one-process load reports the duplicate)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = contiguous_shares(items, [len(packs[p]) for p, _ in items], workers)
    # forked with the packs as an initializer's argument: a fork copies them by reference, not by pickle
    with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork"),
                             initializer=_share_packs, initargs=(packs,)) as pool:
        futures = [pool.submit(_packs_part, window_id, share) for share in shares[1:]]
        store = BlobStore(packs, cache_limit)
        w = WindowData(window_id=window_id, docs=store)
        builder = ColumnsBuilder()
        with held_off():
            _load_packs(w, packs, shares[0], builder)
            parts = [fut.result() for fut in futures]
    return (w, builder) if _merge_parts(w, builder, parts) else None


def parse_doc(text: str | bytes, where: str, one_line: bool = False) -> PatternsDoc:
    """One pattern document from its JSON text. The common case (a valid document) is parsed and
    validated in one pass by pydantic's JSON parser; a failing one is parsed again the slow way, so
    the error says what is wrong in words (not JSON, not an object, another schema, which field)."""
    try:
        return PatternsDoc.model_validate_json(text)
    except ValidationError:
        pass
    try:
        raw = json.loads(text)
    except RecursionError as exc:
        raise RunDirError("nested too deeply to be a pattern document (a hostile or corrupt file)", path=where,
                          field="body") from exc
    except UnicodeDecodeError as exc:
        raise RunDirError(f"not UTF-8 text (byte {exc.start}): the file is corrupt", path=where) from exc
    except json.JSONDecodeError as exc:
        if one_line:     # a line of a packed file: `where` names the line
            raise RunDirError(f"not valid JSON (column {exc.colno}): {exc.msg}", path=where) from exc
        raise RunDirError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}; "
                          "the file is truncated or corrupt", path=where) from exc
    if not isinstance(raw, dict):
        raise RunDirError(f"expected a JSON object, got {type(raw).__name__}", path=where)
    schema = raw.get("schema")
    if schema != PATTERNS_SCHEMA:
        raise RunDirError(f"expected {PATTERNS_SCHEMA!r}, got {schema!r}", path=where, field="schema")
    return PatternsDoc.model_validate(raw)


def _parse_or_report(w: WindowData, read: Callable[[], bytes], where: str,
                     one_line: bool = False) -> PatternsDoc | None:
    """The document `read` returns, or None with its problems (file and field) added to `w`."""
    try:
        return parse_doc(read(), where, one_line)
    except RunDirError as exc:
        w.problems.append(LoadProblem(where, exc.field or "", exc.message))
    except ValidationError as exc:
        for err in exc.errors()[:5]:
            w.problems.append(LoadProblem(where, ".".join(str(x) for x in err["loc"]), err["msg"]))
    except OSError as exc:
        w.problems.append(LoadProblem(where, "", f"cannot read: {exc.strerror}"))
    return None


PARALLEL_MIN_BYTES = 32 << 20     # pattern bytes of a window below which one process loads it


def load_window(wdir: Path, cache_limit: int = 4096, workers: int = 1) -> WindowData:
    """`cache_limit`: how many parsed documents to keep in memory (the rest are read again on demand).
    `workers` > 1: a wide window's files are parsed in that many processes (forked; the caller's
    own process is one of them) and their columns merged, in file order."""
    files = sorted(wdir.iterdir())
    if workers > 1:
        w = _load_parallel(wdir, files, cache_limit, workers)
        if w is not None:
            return w
    w = WindowData(window_id=wdir.name, docs=DocStore(cache_limit))
    builder = ColumnsBuilder()
    with held_off():     # many objects, no cycles: the cyclic collector would only rescan them
        _load_files(w, files, builder)
        w._columns = builder.build()
    return w


def _load_files(w: WindowData, files: list[Path], builder: ColumnsBuilder) -> None:
    store = w.docs
    assert isinstance(store, DocStore)

    def keep(doc: PatternsDoc, where: tuple[str, int, int], name: str) -> None:
        if doc.job.rank in store:
            w.problems.append(LoadProblem(name, "job.rank", f"duplicate rank {doc.job.rank}; first one kept"))
            return
        store.add(doc.job.rank, where, doc)
        builder.add(doc)

    for f in files:
        t = TRACE_FILE.match(f.name)
        if t:
            w.raw_traces[int(t.group(1))] = str(f.resolve())
        if PACKED_FILE.match(f.name):
            _load_packed(w, f, keep)
            continue
        m = RANK_FILE.match(f.name)
        if not m:
            continue
        doc = _parse_or_report(w, f.read_bytes, str(f))
        if doc is None:
            continue
        rank = doc.job.rank
        if int(m.group(1)) != rank:
            w.problems.append(
                LoadProblem(str(f), "job.rank", f"file name says rank {m.group(1)}, document says {rank}")
            )
        keep(doc, (str(f), 0, -1), str(f))


def _load_part(wdir: Path, files: list[Path]) -> tuple[ColumnsBuilder, WindowData]:
    """A worker's share: its columns and what it found (documents stay here: the caller's store
    reads them again from their file when asked)."""
    w = WindowData(window_id=wdir.name, docs=DocStore(0))
    builder = ColumnsBuilder()
    with held_off():
        _load_files(w, files, builder)
    return builder.seal(), w


def _load_parallel(wdir: Path, files: list[Path], cache_limit: int, workers: int) -> WindowData | None:
    """None when the window is too small to pay for the workers, or when a rank appears in two
    shares (the one-process load reports the duplicate as it always has)."""
    sized = [(f, f.stat().st_size) for f in files if is_pattern_file(f) and f.is_file()]
    total = sum(n for _, n in sized)
    if total < PARALLEL_MIN_BYTES or len(sized) < workers:
        return None
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = contiguous_shares([f for f, _ in sized], [n for _, n in sized], workers)
    others = [f for f in files if not (is_pattern_file(f) and f.is_file())]
    with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_load_part, wdir, share) for share in shares[1:]]
        w = WindowData(window_id=wdir.name, docs=DocStore(cache_limit))
        builder = ColumnsBuilder()
        with held_off():
            _load_files(w, shares[0] + others, builder)
            parts = [fut.result() for fut in futures]
    if not _merge_parts(w, builder, parts):
        return None
    with held_off():
        w._columns = builder.build()
    return w


def _merge_parts(w: WindowData, builder: ColumnsBuilder, parts: list[tuple[ColumnsBuilder, WindowData]]) -> bool:
    """Add to `w` (this process's share, its columns in `builder`) the other processes' shares after
    it, in order; False when a rank appears in two shares (the one-process load names the duplicate)."""
    store = w.docs
    assert isinstance(store, DocStore)
    for b, part in parts:
        pstore = part.docs
        assert isinstance(pstore, DocStore)
        if any(r in store for r in pstore):
            return False
        for r in pstore:
            store.add(r, pstore._where[r], None)
        builder.merge(b)
        w.problems += part.problems
        w.raw_traces.update(part.raw_traces)
    return True


def _load_packed(w: WindowData, f: Path, keep: Callable[[PatternsDoc, tuple[str, int, int], str], None]) -> None:
    """`host-<name>.jsonl` / `pack-<name>.jsonl`: one pattern document per line (a host's ranks, or a
    whole job's), so a 100,000-rank window need not be 100,000 files."""
    try:
        fh = open(f, "rb")
    except OSError as exc:
        w.problems.append(LoadProblem(str(f), "", f"cannot read: {exc.strerror}"))
        return
    with fh:
        off = 0
        for n, line in enumerate(fh, 1):
            start, off = off, off + len(line)
            if not line.strip():
                continue
            where = f"{f}:{n}"
            doc = _parse_or_report(w, lambda: line, where, one_line=True)
            if doc is not None:
                keep(doc, (str(f), start, len(line)), where)


def load_run(run_dir: Path, window: str | None = None, cache_limit: int = 4096,
             workers: int = 1) -> list[WindowData]:
    """The windows of a run directory. Also accepted where a user would point: an incident
    (`INC-XXXX/`, its windows under `patterns/`), one window's directory, or one pattern file (the
    window that holds it)."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and is_pattern_file(run_dir):
        run_dir, window = run_dir.parent.parent, run_dir.parent.name
    if (run_dir / "patterns").is_dir() and not any(is_pattern_file(f) for f in run_dir.iterdir()):
        run_dir = run_dir / "patterns"         # an incident directory
    if run_dir.is_dir() and any(is_pattern_file(f) for f in run_dir.iterdir() if f.is_file()):
        if window not in (None, run_dir.name):
            raise RunDirError(f"{run_dir}: a window directory, not window {window!r}")
        return [load_window(run_dir, cache_limit, workers)]      # one window's directory
    if not run_dir.exists():
        raise RunDirError(f"{run_dir}: no such file or directory (expected RUN_DIR/<window>/rank-<R>.json, a "
                          "window directory, an incident directory or a pattern file)")
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected RUN_DIR/<window>/rank-<R>.json, a window "
                          f"directory, an incident directory or a pattern file)")
    dirs = sorted(d for d in run_dir.iterdir() if d.is_dir() and any(
        RANK_FILE.match(f.name) or PACKED_FILE.match(f.name) for f in d.iterdir()))
    if window is not None:
        dirs = [d for d in dirs if d.name == window]
        if not dirs:
            raise RunDirError(f"{run_dir}: no window named {window!r}")
    return [load_window(d, cache_limit, workers) for d in dirs]
