"""The window as arrays (engine/columns.py), the lazy document store, and the fast paths of the
robust statistics against their plain definitions."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from patterns_factory import STEPS, make_doc, write_run

from eroica.engine.columns import window_columns
from eroica.engine.groups import bimodal_split
from eroica.engine.load import load_run
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.robust import MAD_TO_SIGMA, SUSPECT_EXCESS_STEP_RATIO, SUSPECT_Z, clean_members
from eroica.lab.simulate import simulate


def test_columns_hold_each_ranks_numbers_in_rank_order_and_none_is_nan() -> None:
    docs = [make_doc(r, busy={"compute:forward": 0.01 * (r + 1), "data:DataLoader.__next__": 0.001}) for r in range(4)]
    hw = docs[2].hardware.model_copy(update={"runqueue_wait_ratio": None})
    docs[2] = docs[2].model_copy(update={"hardware": hw})
    c = window_columns([docs[3], docs[1], docs[0], docs[2]])          # any load order
    assert c.ranks == [0, 1, 2, 3] and c.hostname == ["host0", "host0", "host1", "host1"]
    j = c.keys.index((docs[0].functions[0].category, "forward"))
    assert c.present[:, j].all() and np.allclose(c.per_step[:, j, :STEPS], [[0.01 * (r + 1)] * STEPS for r in range(4)])
    assert c.n_steps.tolist() == [STEPS] * 4
    assert np.allclose(c.critical[:, j], [0.01 * (r + 1) * STEPS for r in range(4)])
    rq = c.signals["runqueue_wait_ratio"]
    assert np.isnan(rq[2]) and rq[0] == 0.1
    assert np.isnan(c.signals["io_wait_ratio"]).all()                 # never sampled: NaN, not 0


def test_a_window_read_back_from_its_files_diagnoses_alike(tmp_path: Path) -> None:
    """Documents beyond the cache are read again from their file and offset (packed lines too)."""
    simulate(tmp_path / "p", 64, "pcie_degraded", seed=2, tp=4, pp=2, packed=True)
    write_run(tmp_path / "f", [make_doc(r) for r in range(4)])
    for run in (tmp_path / "p", tmp_path / "f"):
        (w,) = load_run(run, cache_limit=0)
        for r in (0, max(w.docs)):
            assert w.docs[r].job.rank == r
        a, b = (diagnose(run, DiagnoseOptions(in_process=True, doc_cache=n)) for n in (0, 4096))
        assert a.model_dump(exclude={"run_dir"}) == b.model_dump(exclude={"run_dir"})


def _clean_reference(busy: np.ndarray, med_step: float, floor: float) -> np.ndarray:
    """The definition: remove the busiest member while it stands out from the lower half of the rest."""
    clean = np.ones(len(busy), dtype=bool)
    while clean.sum() > max(len(busy) // 2, 1):
        vals = busy[clean]
        low = np.sort(vals)[: max((len(vals) + 1) // 2, 2)]
        med = float(np.median(low))
        mad = float(np.median(np.abs(low - med))) * MAD_TO_SIGMA
        j = int(np.flatnonzero(clean)[int(np.argmax(vals))])
        if (busy[j] - med) / med_step < SUSPECT_EXCESS_STEP_RATIO or (busy[j] - med) / max(mad, floor) < SUSPECT_Z:
            break
        clean[j] = False
    return clean


def _bimodal_reference(values: list[float], floor: float) -> tuple[list[int], list[int]] | None:
    n = len(values)
    order = sorted(range(n), key=lambda i: values[i])
    v = [values[i] for i in order]
    for k in range(2, n - 1):
        lo, hi = v[: n - k], v[n - k:]
        if len(lo) < 2 or min(len(lo), len(hi)) < n / 4:
            continue
        mlo, mhi = float(np.median(lo)), float(np.median(hi))
        if mlo <= 0 or mhi / mlo < 1.3 or hi[-1] / max(hi[0], 1e-12) > 1.3 or lo[-1] / max(lo[0], 1e-12) > 1.3:
            continue
        mad = max(float(np.median(np.abs(np.asarray(lo) - mlo))), float(np.median(np.abs(np.asarray(hi) - mhi))))
        if hi[0] - lo[-1] > 3.0 * max(mad * 1.4826, floor):
            return sorted(order[: n - k]), sorted(order[n - k:])
    return None


def test_the_sorted_suspect_removal_and_mode_split_equal_their_definitions() -> None:
    rng = random.Random(11)
    for trial in range(300):
        n = rng.choice([3, 4, 5, 8, 17, 64, 200])
        busy = np.array([round(rng.lognormvariate(0, 0.05) * 0.1, 3) for _ in range(n)])
        for _ in range(rng.randrange(0, n // 2 + 1)):           # some slow ranks, ties included
            busy[rng.randrange(n)] = rng.choice([0.2, 0.2, 0.15, 0.3])
        assert (clean_members(busy, 0.12, 0.0012) == _clean_reference(busy, 0.12, 0.0012)).all(), trial
        work = [float(x) for x in busy] if trial % 2 else [rng.choice([10.0, 20.0]) * rng.uniform(1, 1.1)
                                                            for _ in range(n)]
        assert bimodal_split(work, 0.1) == _bimodal_reference(work, 0.1), trial


def test_a_wide_window_loaded_by_two_processes_is_the_window_loaded_by_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each process parses a share of the files; the columns are merged (rows, function and
    operation-set indices, offsets renumbered): the diagnosis is the same to the byte, a duplicate
    rank across shares falls back to the one-process load, and a bad line is still reported."""
    import eroica.engine.load as load

    run = tmp_path / "p"
    simulate(run, 320, "gpu_throttled", seed=4, tp=8, pp=5, packed=True, ep=2)
    bad = run / "w000-s200" / "host-zz.jsonl"
    bad.write_text('{"not": "a pattern"}\n')
    monkeypatch.setattr(load, "PARALLEL_MIN_BYTES", 1)
    one = diagnose(run, DiagnoseOptions(in_process=True, workers=1))
    two = diagnose(run, DiagnoseOptions(in_process=True, workers=2))
    assert one.model_dump(exclude={"run_dir"}) == two.model_dump(exclude={"run_dir"})
    assert any("host-zz.jsonl:1" in p for p in two.windows[0].coverage.file_problems)
    (w,) = load_run(run, workers=2)
    assert w.docs[319].job.rank == 319                 # a worker's document, read again from its line
    c1, c2 = load_run(run, workers=1)[0].columns, w.columns
    assert c1.keys == c2.keys and np.array_equal(c1.per_step, c2.per_step) and c1.op_sets == c2.op_sets
    # the same rank in two shares: the one-process load reports the duplicate
    src = (run / "w000-s200" / "host-node00000.jsonl").read_text()
    (run / "w000-s200" / "host-zzz.jsonl").write_text(src)
    again = load_run(run, workers=2)[0]
    assert any("duplicate rank 0" in str(p) for p in again.problems)


def test_simulated_documents_are_exactly_valid_pattern_documents(tmp_path: Path) -> None:
    """The simulator writes the JSON itself (fast): each line is what PatternsDoc would write, and the
    files do not depend on how many processes wrote them."""
    import json

    from eroica.schema.patterns import PatternsDoc

    for workers, d in ((1, tmp_path / "one"), (2, tmp_path / "two")):
        simulate(d, 96, "host_launch_bound", seed=7, tp=4, pp=3, packed=False, workers=workers)
    for f in sorted((tmp_path / "one" / "w000-s200").iterdir()):
        raw = f.read_bytes()
        assert json.loads(raw) == PatternsDoc.model_validate_json(raw).model_dump(mode="json", by_alias=True)
        assert raw == (tmp_path / "two" / "w000-s200" / f.name).read_bytes()
