"""Property tests over damaged pattern files: truncated, another schema or version, NaN, extreme
values, missing ranks (up to 20%), duplicated ranks. Each damaged file is named with its field, the
rest of the window is still diagnosed (the culprit still found), and missing ranks lower coverage
and confidence. Nothing ever raises."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from patterns_factory import make_doc

from eroica.engine.pipeline import DiagnoseOptions, diagnose

WORLD = 10
CULPRIT = 2
OPTS = DiagnoseOptions(in_process=True)
# (path into the document, what the damaged file must be reported with)
NUMBERS = [
    (("step_times", "during_seconds", 0), "step_times.during_seconds.0"),
    (("functions", 0, "critical_seconds"), "functions.0.critical_seconds"),
    (("hardware", "cpu_util_ratio"), "hardware.cpu_util_ratio"),
    (("functions", 1, "metric_mean"), "functions.1.metric_mean"),
]
DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.05, 0.95)),
    st.tuples(st.just("schema"), st.sampled_from(["eroica.patterns/v2", "eroica.patterns/v0", "patterns", ""])),
    st.tuples(st.just("nan"), st.sampled_from(range(len(NUMBERS))), st.sampled_from([math.nan, math.inf, -math.inf])),
    st.tuples(st.just("negative"), st.sampled_from(range(2))),
    st.tuples(st.just("extreme"), st.sampled_from(range(len(NUMBERS))), st.sampled_from([0.0, 1e-12, 1e6, 1e12])),
    st.tuples(st.just("missing")),
    st.tuples(st.just("duplicate")),
)


def docs() -> dict[int, dict]:
    out = {}
    for r in range(WORLD):
        busy = {"compute:forward": 0.02, "compute:backward": 0.03,
                "data:DataLoader.__next__": 0.1 if r == CULPRIT else 0.001}
        out[r] = json.loads(make_doc(r, world=WORLD, step=0.16, busy=busy).model_dump_json(by_alias=True))
    return out


def put(d: dict, path: tuple, value: object) -> None:
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


@given(st.dictionaries(st.sampled_from([r for r in range(WORLD) if r != CULPRIT]), DAMAGE, max_size=4))
def test_damaged_files_are_named_and_the_rest_is_diagnosed(damage: dict[int, tuple]) -> None:
    damage = dict(list(damage.items())[:3]) if sum(d[0] == "missing" for d in damage.values()) > 2 else damage
    with tempfile.TemporaryDirectory() as tmp:
        wdir = Path(tmp) / "w000-s30"
        wdir.mkdir()
        expect_problem: dict[str, str] = {}      # file -> text its problem must contain
        valid = set(range(WORLD))
        for r, d in docs().items():
            kind = damage.get(r, ("none",))
            path = wdir / f"rank-{r}.json"
            text = json.dumps(d)
            if kind[0] == "missing":
                valid.discard(r)
                continue
            if kind[0] == "truncate":
                text = text[: int(len(text) * kind[1])]
                expect_problem[path.name] = "not valid JSON"
            elif kind[0] == "schema":
                d["schema"] = kind[1]
                text = json.dumps(d)
                expect_problem[path.name] = "(field schema)"
            elif kind[0] == "nan":
                where, field = NUMBERS[kind[1]]
                put(d, where, kind[2])
                text = json.dumps(d)
                expect_problem[path.name] = f"(field {field})"
            elif kind[0] == "negative":
                where, field = NUMBERS[kind[1]]
                put(d, where, -1.0)
                text = json.dumps(d)
                expect_problem[path.name] = f"(field {field})"
            elif kind[0] == "extreme":
                put(d, NUMBERS[kind[1]][0], kind[2])       # valid, if absurd: diagnosed, never a crash
                text = json.dumps(d)
            elif kind[0] == "duplicate":                  # the same rank again, in a host's packed file
                (wdir / f"host-dup{r}.jsonl").write_text(text + "\n")
                expect_problem[f"rank-{r}.json"] = f"duplicate rank {r}"
            if kind[0] in ("truncate", "schema", "nan", "negative"):
                valid.discard(r)
            path.write_text(text)
        (w,) = diagnose(Path(tmp), OPTS).windows
        problems = "\n".join(w.coverage.file_problems)
        for name, text in expect_problem.items():
            assert any(name in p and text in p for p in w.coverage.file_problems), (name, text, problems)
        assert w.coverage.ranks_reported == sorted(valid)
        assert w.coverage.coverage_ratio == round(len(valid) / WORLD, 4)
        top = w.findings[0]
        assert (top.root_cause, top.ranks) == ("dataloader_stall", [CULPRIT]), [f.root_cause for f in w.findings]
        assert top.confidence_factors.coverage_ratio == round(0.5 + 0.5 * len(valid) / WORLD, 4)
        assert all(math.isfinite(f.confidence) and 0 <= f.confidence <= 1 for f in w.findings)


def test_missing_ranks_lower_the_confidence_and_say_which() -> None:
    def run(drop: set[int]):  # type: ignore[no-untyped-def]
        with tempfile.TemporaryDirectory() as tmp:
            wdir = Path(tmp) / "w000-s30"
            wdir.mkdir()
            for r, d in docs().items():
                if r not in drop:
                    (wdir / f"rank-{r}.json").write_text(json.dumps(d))
            return diagnose(Path(tmp), OPTS).windows[0]

    full, part = run(set()), run({7, 9})
    assert part.coverage.ranks_missing == [7, 9] and full.coverage.ranks_missing == []
    assert part.findings[0].ranks == full.findings[0].ranks == [CULPRIT]
    assert part.findings[0].confidence < full.findings[0].confidence
