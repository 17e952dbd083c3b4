"""`eroica rules new --from RUN/WINDOW --rank K --cause C --knowledge DIR`: a site rule scaffolded from a
window the engine got wrong (or did not explain). Its conditions are the facts that single rank K out
in that window (what it costs the job, the function or category that holds its excess, the hardware
signal furthest from its peers'), each threshold half-way between the window's value and a healthy
one; its firing test is the window's real facts; each threshold gets a quiet test that moves only that
field just across it. It passes `eroica rules lint` and `rules test` as written; the author then edits
its title, summary, false positives and thresholds, and records the incident."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import EngineError
from eroica.engine.facts import Fact
from eroica.engine.rules.layers import KnowledgeSpec, load

MAX_SIGNALS = 1        # hardware signals a scaffold conditions on (the furthest from the peers')
SIGNAL_APART = 1.5     # a signal this many times its peers' median (or 1/x of it) singles a rank out


class ScaffoldError(EngineError):
    """The window, rank or cause cannot make a rule; says what to pass instead."""


def nice(x: float) -> float:
    """Two significant digits."""
    if x == 0:
        return 0.0
    d = 1 - int(math.floor(math.log10(abs(x))))
    return round(x, d)


def _between(observed: float, neutral: float) -> tuple[str, float, float]:
    """(operator, threshold, a value just across it on the quiet side) half-way from `neutral` to `observed`."""
    t = nice(neutral + (observed - neutral) / 2)
    step = 10 ** (math.floor(math.log10(abs(t))) - 2) if t else 0.001
    if observed >= neutral:
        return "gte", t, round(t - step, 10)
    return "lte", t, round(t + step, 10)


def _window_facts(source: Path, rank: int) -> tuple[str, list[Fact]]:
    from eroica.engine.load import load_run
    from eroica.engine.pipeline import analyze_windows

    source = Path(source)
    run, window = (source.parent, source.name) if source.is_dir() and any(
        f.name.startswith("rank-") for f in source.iterdir()) else (source, None)
    windows = load_run(run)
    if not windows:
        raise ScaffoldError(f"{source}: no window directories with rank-<R>.json files")
    chosen = next((w for w in windows if w.window_id == window), None) if window else windows[-1]
    if chosen is None:
        raise ScaffoldError(f"{source}: no window {window!r} in {run}")
    facts = [f for f in analyze_windows(windows)[chosen.window_id].facts if f.rank == rank]
    if not any(f.kind in ("rank_slowness", "job_slowdown") for f in facts):  # type: ignore[attr-defined]
        raise ScaffoldError(f"rank {rank} does not stand out in window {chosen.window_id} (no rank_slowness or "
                            f"job_slowdown fact: it is not slower than its peers, nor the job than its history); "
                            f"`eroica diagnose {run} --facts` lists every rank's facts")
    return chosen.window_id, facts


def _pick(facts: list[Fact]) -> list[tuple[str, Fact, dict[str, Any]]]:
    """(alias, fact, its where-tests) for the conditions: the rank's cost, its excess, its signal."""
    by: dict[str, list[Any]] = {}
    for f in facts:
        by.setdefault(f.kind, []).append(f)  # type: ignore[attr-defined]
    out: list[tuple[str, Fact, dict[str, Any]]] = []
    if "rank_slowness" in by:
        s = by["rank_slowness"][0]
        out.append(("slow", s, {"excess_step_ratio": _between(s.excess_step_ratio, 0.0)}))
    else:
        j = by["job_slowdown"][0]
        out.append(("job", j, {"step_ratio_to_baseline": _between(j.step_ratio_to_baseline, 1.0)}))
    fns = sorted(by.get("function_outlier", []), key=lambda f: -f.explains_ratio)
    cats = sorted(by.get("category_excess", []), key=lambda f: -f.explains_ratio)
    if fns and fns[0].explains_ratio > 0:
        f = fns[0]
        out.append(("fn", f, {"category": f.category, "function": f.function,
                              "explains_ratio": _between(f.explains_ratio, 0.0)}))
    elif cats and cats[0].explains_ratio > 0:
        c = cats[0]
        out.append(("cat", c, {"category": c.category, "explains_ratio": _between(c.explains_ratio, 0.0)}))
    apart = [s for s in by.get("hw_signal", []) if s.ratio_to_median >= SIGNAL_APART
             or 0 < s.ratio_to_median <= 1 / SIGNAL_APART]
    apart.sort(key=lambda s: -abs(math.log(s.ratio_to_median)))
    for s in apart[:MAX_SIGNALS]:
        out.append(("sig", s, {"signal": s.signal, "ratio_to_median": _between(s.ratio_to_median, 1.0)}))
    for d in by.get("config_deviation", [])[:1]:
        out.append(("cfg", d, {"key": d.key, "value": d.value}))
    return out


def _flow(d: dict[str, Any]) -> str:
    return str(yaml.safe_dump(d, default_flow_style=True, width=10**6, sort_keys=False)).strip()


def _with(fact: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    return {**fact, field: value}


def scaffold(source: Path, rank: int, cause: str, spec: KnowledgeSpec, site: Path,
             rule_id: str | None = None, owner: str = "site-sre") -> tuple[Path, str]:
    """(where the rule goes, its YAML text) for `cause` on `rank` in the window at `source`."""
    from eroica.engine.rules.reach import closest

    k = load(spec)                                    # the knowledge must load: the rule is checked against it
    if cause not in k.taxonomy:
        raise ScaffoldError(f"unknown root cause {cause!r}; {closest(cause, k.taxonomy)}; a new one goes in "
                            f"{site / 'taxonomy.yaml'}, under root_causes: with its category, component, question "
                            "and runbook")
    window, facts = _window_facts(source, rank)
    picked = _pick(facts)
    rid = rule_id or f"site.{cause.replace('_', '-')}-" + re.sub(r"[^a-z0-9]+", "-", str(
        next((getattr(f, "function", "") for a, f, _ in picked if a == "fn"), "rank")).lower()).strip("-")[:40]
    if not re.match(r"^[a-z0-9]+(\.[a-z0-9]+(-[a-z0-9]+)*)+$", rid):
        raise ScaffoldError(f"rule id {rid!r}: ids look like `site.kebab-name`; pass --id")
    if k.entry(rid) is not None:
        raise ScaffoldError(f"rule id {rid!r} is already used ({k.entry(rid).written.path}); pass --id")  # type: ignore[union-attr]
    given = [{"kind": f.model_dump()["kind"], **f.model_dump(mode="json")} for _, f, _ in picked]
    when, quiet = [], []
    for i, (alias, f, tests) in enumerate(picked):
        where: dict[str, Any] = {"rank": "$rank"}
        for field, t in tests.items():
            if isinstance(t, tuple):
                op, thr, across = t
                where[field] = {op: thr}
                moved = [_with(g, field, across) if j == i else g for j, g in enumerate(given)]
                quiet.append((f"quiet when {f.kind}.{field} is just {'under' if op == 'gte' else 'over'} "  # type: ignore[attr-defined]
                              f"{thr:g}", moved))
            else:
                where[field] = t
        when.append(f"  - {{fact: {f.kind}, as: {alias}, where: {_flow(where)}}}")  # type: ignore[attr-defined]
    fn = next(("$fn.function" for a, _, _ in picked if a == "fn"), None) or next(
        ("$cat.top_function" for a, _, _ in picked if a == "cat"), None)
    function = next((getattr(f, "function", None) or getattr(f, "top_function", None)
                     for a, f, _ in picked if a in ("fn", "cat")), None)
    anchor = picked[0][0]
    what = ("{fn.function}" if fn == "$fn.function" else "{cat.top_function}" if fn else "")
    summary = (f"Rank {{{anchor}.rank}} is slow" + (f" in {what}" if what else "")
               + next((", {sig.signal} at {sig.ratio_to_median:.1f}x its peers'" for a, _, _ in picked
                       if a == "sig"), "") + f" ({cause}).")
    expect = {"rank": rank, "root_cause": cause, **({"function": function} if function else {})}
    lines = [
        "schema: eroica.rule/v1",
        f"id: {rid}",
        f"title: {cause} on a rank like rank {rank} of {Path(source).name} (edit me)",
        "status: experimental",
        "severity: medium",
        f"taxonomy: {cause}",
        f"owner: {owner}",
        f"# scaffolded by `eroica rules new` from {source} (window {window}), rank {rank}: each threshold is",
        "# half-way between that window's value and a healthy one; tighten them, and say when it misleads",
        "falsepositives: [When does this signature appear without the cause? (edit me)]",
        "when:", *when,
        "emit:",
        "  confidence: 0.7       # the prior; the reported confidence is this times the measured factors",
        *([f"  function: {fn}"] if fn else []),
        f"  summary: {json.dumps(summary)}",
        "tests:",
        f"  - name: fires on rank {rank} of window {window}",
        "    given:", *(f"      - {_flow(g)}" for g in given),
        f"    expect: [{_flow(expect)}]",
    ]
    for name, g in quiet:
        lines += [f"  - name: {name}", "    given:", *(f"      - {_flow(x)}" for x in g), "    expect: []"]
    return site / "rules" / f"{rid.split('.', 1)[1].replace('-', '_')}.yaml", "\n".join(lines) + "\n"
