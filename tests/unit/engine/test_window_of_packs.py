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


def test_a_wide_window_of_packs_parsed_by_two_processes_is_the_window_parsed_by_one(tmp_path: Path,
                                                                                     monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The service's worker parses a wide window's packs in forked processes: the same columns, the
    same diagnosis, the same named problems, and documents read again from the packs they came in."""
    import numpy as np

    import eroica.engine.load as load
    from eroica.engine.pipeline import DiagnoseOptions, diagnose_documents
    from eroica.lab.simulate import simulate

    simulate(tmp_path / "sim", 320, "gpu_throttled", seed=4, tp=8, pp=5, packed=True)
    packs = [gzip.compress(f.read_bytes(), 1) for f in sorted((tmp_path / "sim").rglob("host-*.jsonl"))]
    packs.insert(7, b'{"not": "a pattern"}\n')
    monkeypatch.setattr(load, "PARALLEL_MIN_PACK_BYTES", 1)
    one, two = (window_of_packs("w000-s200", packs, workers=n) for n in (1, 2))
    c1, c2 = one.columns, two.columns
    assert c1.ranks == c2.ranks == list(range(320)) and c1.keys == c2.keys and c1.op_sets == c2.op_sets
    assert np.array_equal(c1.per_step, c2.per_step) and np.array_equal(c1.ops, c2.ops)
    assert [p.path for p in two.problems] == [p.path for p in one.problems] == ["w000-s200/pack 7:1"]
    assert two.docs[319].model_dump() == one.docs[319].model_dump()   # a forked parser's document, read again
    d1, d2 = (diagnose_documents([w], opts=DiagnoseOptions(in_process=True), run="r") for w in (one, two))
    assert d1.model_dump() == d2.model_dump() and d1.windows[0].findings
    # a rank in two shares: the one-process parse names the duplicate
    dup = window_of_packs("w000-s200", [*packs, packs[0]], workers=2)
    assert any("duplicate rank" in p.message for p in dup.problems)
