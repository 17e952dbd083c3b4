"""The engine's document entry: a window from packs of JSON text (gzip'd or not, one document per
line), parsed once into columns, kept as compressed text and read again when asked for."""

from __future__ import annotations

import gzip
from pathlib import Path

from eroica.engine.load import load_window, window_of_packs

INC = Path(__file__).parents[3] / "incidents" / "INC-0017" / "patterns"


def texts() -> list[bytes]:
    wdir = sorted(p for p in INC.iterdir() if p.is_dir())[0]
    return [f.read_bytes().strip() for f in sorted(wdir.glob("rank-*.json"))]


def test_packs_give_the_columns_a_run_directory_gives_and_documents_are_read_again_from_them() -> None:
    docs = texts()
    packs = [gzip.compress(docs[0] + b"\n" + docs[1] + b"\n"), docs[2] + b"\n" + docs[3]]
    w = window_of_packs("w", packs, cache_limit=1)
    ref = load_window(sorted(p for p in INC.iterdir() if p.is_dir())[0])
    assert w.columns.ranks == ref.columns.ranks == [0, 1, 2, 3]
    assert (w.columns.step == ref.columns.step).all()
    for r in (3, 0, 2):                                   # out of the one-document cache: parsed again
        assert w.docs[r].model_dump() == ref.docs[r].model_dump()
    assert w.problems == []


def test_only_the_referenced_lines_count_and_a_bad_or_repeated_line_is_a_named_problem() -> None:
    docs = texts()
    packs = [docs[0] + b"\n{not json\n" + docs[1], docs[1] + b"\n" + docs[2]]
    w = window_of_packs("w", packs, refs=[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 5)])
    assert sorted(w.docs) == [0, 1, 2]
    where = sorted((p.path, p.field) for p in w.problems)
    assert where == [("w/pack 0:2", ""), ("w/pack 1:1", "job.rank"), ("w/pack 1:6", "")]
    assert "duplicate rank 1" in next(p.message for p in w.problems if p.field == "job.rank")
