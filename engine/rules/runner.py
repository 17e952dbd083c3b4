"""Runs the rule engine in a worker process that exits afterwards.

durable-rules never returns fact memory and can crash natively on bad input; a worker process
per diagnosis contains both. Inline rule tests run in one worker, each on a fresh host.
"""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eroica.engine.facts import Fact
from eroica.engine.rules.conclusion import Conclusion, Derived, typed_results
from eroica.engine.rules.ir import RuleIR

RawResults = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _worker_evaluate(rules: list[RuleIR], facts_by_window: dict[str, list[dict[str, Any]]]) -> dict[str, RawResults]:
    from eroica.engine.rules._durable import run_ir

    return {w: run_ir(rules, facts) for w, facts in facts_by_window.items()}


def _in_worker(fn: Any, *args: Any) -> Any:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def run_rules(rules: list[RuleIR], facts_by_window: dict[str, list[Fact]], in_process: bool = False,
             site_dirs: list[Path] | None = None) -> dict[str, tuple[list[Conclusion], list[Derived]]]:
    """Each window's typed facts in, its typed conclusions and derived hypotheses out; plain data only
    crosses to the worker."""
    plain = {w: [f.model_dump(mode="json") for f in fs] for w, fs in facts_by_window.items()}
    raw: dict[str, RawResults] = (_worker_evaluate(rules, plain) if in_process
                                  else _in_worker(_worker_evaluate, rules, plain))
    return {w: typed_results(r, site_dirs) for w, r in raw.items()}


@dataclass(frozen=True)
class RuleTestCase:
    rule_id: str
    name: str
    rules: tuple[RuleIR, ...]          # the rule under test, then the rules deriving what it consumes
    given: tuple[dict[str, Any], ...]
    expect: tuple[dict[str, Any], ...]
    path: str


@dataclass(frozen=True)
class RuleTestOutcome:
    rule_id: str
    name: str
    path: str
    passed: bool
    detail: str


def _matches(exp: dict[str, Any], got: dict[str, Any]) -> bool:
    for k, v in exp.items():
        g = got.get(k)
        if isinstance(v, float) and isinstance(g, (int, float)):
            if not math.isclose(v, g, rel_tol=1e-6, abs_tol=1e-9):
                return False
        elif g != v:
            return False
    return True


def _worker_tests(cases: list[RuleTestCase]) -> list[RuleTestOutcome]:
    from eroica.engine.rules._durable import run_ir

    out = []
    for c in cases:
        try:
            conclusions, derived = run_ir(list(c.rules), [dict(g) for g in c.given])
        except Exception as exc:
            out.append(RuleTestOutcome(c.rule_id, c.name, c.path, False, f"engine error: {exc}"))
            continue
        # what the rule under test concludes or derives (the chain's own derivations are its inputs)
        got = conclusions + [dict(d["fact"], rule_id=d["rule_id"]) for d in derived if d["rule_id"] == c.rule_id]
        remaining = list(got)
        missing = []
        for e in c.expect:
            hit = next((g for g in remaining if _matches(e, g)), None)
            if hit is None:
                missing.append(e)
            else:
                remaining.remove(hit)
        if missing or remaining:
            shown = [{k: g.get(k) for k in ("rule_id", "root_cause", "kind", "rank", "function") if k in g}
                     for g in remaining]
            out.append(RuleTestOutcome(c.rule_id, c.name, c.path, False,
                                   f"expected {list(c.expect)}, missing {missing}, unexpected {shown}"))
        else:
            out.append(RuleTestOutcome(c.rule_id, c.name, c.path, True, f"{len(got)} conclusion(s) as expected"))
    return out


def run_tests(cases: list[RuleTestCase], in_process: bool = False) -> list[RuleTestOutcome]:
    if in_process:
        return _worker_tests(cases)
    out: list[RuleTestOutcome] = _in_worker(_worker_tests, cases)
    return out
