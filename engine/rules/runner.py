"""Runs the rule engine in a worker process that exits afterwards.

durable-rules never returns fact memory and can crash natively on bad input; a worker process
per diagnosis contains both. Inline rule tests run in one worker, each on a fresh host.
"""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from eroica.engine.rules.compiler import RuleIR


def _worker_evaluate(rules: list[RuleIR], facts_by_window: dict[str, list[dict[str, Any]]]):  # type: ignore[no-untyped-def]
    from eroica.engine.rules._durable import run_ir

    return {w: run_ir(rules, facts)[0] for w, facts in facts_by_window.items()}


def _in_worker(fn: Any, *args: Any) -> Any:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def evaluate(rules: list[RuleIR], facts_by_window: dict[str, list[dict[str, Any]]],
             in_process: bool = False) -> dict[str, list[dict[str, Any]]]:
    if in_process:
        return _worker_evaluate(rules, facts_by_window)
    return _in_worker(_worker_evaluate, rules, facts_by_window)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RuleTestCase:
    rule_id: str
    name: str
    rules: tuple[RuleIR, ...]          # the rule under test
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
        got = conclusions + derived
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
    return _in_worker(_worker_tests, cases)  # type: ignore[no-any-return]
