"""The only module that imports durable_rules: RuleIR -> a JSON ruleset on a private host.

Absorbs durable_rules' traps: no background timer threads,
no module-global registry, a unique ruleset name per run, batch asserts that still run actions,
JSON-safe floats, aliases prefixed so they never shadow `Closure` attributes, one sink rule per
derived fact kind, and action errors collected and raised instead of swallowed.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

import durable_rules_engine as dre
from durable import engine

from eroica.engine.errors import RuleRuntimeError
from eroica.engine.facts import FACT_TYPES
from eroica.engine.rules.ir import REF, RuleIR

PREFIX = "f_"
_OPS = {"gt": "$gt", "gte": "$gte", "lt": "$lt", "lte": "$lte", "ne": "$neq"}
_BARE_EXP = re.compile(r"^-?\d+e")
_counter = itertools.count()


class _Host(engine.Host):
    def _run(self) -> None:  # no self-rescheduling timer threads
        pass

    def assert_event(self, ruleset_name: str, message: Any) -> Any:
        return self.post(ruleset_name, message)

    def close(self) -> None:
        rulesets: list[Any] = self._ruleset_list
        for rs in rulesets:
            dre.delete_ruleset(rs._handle)
        self._ruleset_list: list[Any] = []
        self._ruleset_directory: dict[str, Any] = {}


def clean(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return None
        if _BARE_EXP.match(repr(v)):
            return math.nextafter(v, math.inf)
        return v
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [clean(x) for x in v]
    return v


def _expr(p: Any) -> dict[str, Any]:
    terms: list[dict[str, Any]] = [{"kind": p.kind}]
    for t in p.tests:
        val = clean(t.value)
        if t.op == "eq":
            terms.append({t.field: val})
        elif t.op == "in":  # branches are mutually exclusive on one field: fires once
            terms.append({"$or": [{t.field: clean(x)} for x in t.value]})
        else:
            terms.append({_OPS[t.op]: {t.field: val}})
    for j in p.joins:
        terms.append({j.field: {PREFIX + j.alias: j.other_field}})
    return terms[0] if len(terms) == 1 else {"$and": terms}


def _content(c: Any) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k != "sid"}


def _public(f: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in f.items() if k != FID}


FID = "_fid"   # a derived fact's provenance key: which rule derived it from which facts


class DurableRun:
    """One ruleset on one private host: assert facts, drain, read conclusions, close."""

    def __init__(self, rules: list[RuleIR]) -> None:
        self.name = f"eroica_{next(_counter)}"
        self.conclusions: list[dict[str, Any]] = []
        self.derived: list[dict[str, Any]] = []
        self.errors: list[str] = []
        # provenance of each derived fact: (the measured facts under it, the hypotheses and rules on the way)
        self.sources: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]] = {}
        self._fids = itertools.count()
        rs: dict[str, Any] = {}
        derived: set[str] = set()
        for r in rules:
            rs[r.id] = {"all": [{PREFIX + p.alias: _expr(p)} for p in r.patterns], "run": self._action(r)}
            if r.derived_kind:
                derived.add(r.derived_kind)
        # every kind no rule consumes still needs a rule to match, or durable-rules rejects the fact
        consumed = {p.kind for r in rules for p in r.patterns}
        for k in sorted(derived | (set(FACT_TYPES) - consumed)):
            rs[f"_sink_{k}"] = {"all": [{"m": {"kind": k}}], "run": lambda c: None}
        self.host = _Host({self.name: rs})

    def _action(self, r: RuleIR) -> Any:
        aliases = [p.alias for p in r.patterns]

        def resolve(v: Any, bound: dict[str, dict[str, Any]]) -> Any:
            if isinstance(v, str):
                m = REF.match(v)
                if m:
                    return bound[m.group(1)].get(m.group(2))
            return v

        def expand(bound: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
            facts: list[dict[str, Any]] = []
            hyps: list[dict[str, Any]] = []
            via: list[str] = []
            for a in aliases:
                f = bound[a]
                src = self.sources.get(str(f.get(FID)))
                if src is None:
                    facts.append(f)
                    continue
                facts += [x for x in src[0] if x not in facts]
                hyps += [x for x in src[1] if x not in hyps]
                via += [x for x in src[2] if x not in via]
            return facts, hyps, via

        def action(c: Any) -> None:  # exactly one parameter: two would make it async
            try:
                bound = {a: _content(getattr(c, PREFIX + a)) for a in aliases}
                first = bound[aliases[0]]
                facts, hyps, via = expand(bound)
                if r.derive is not None:
                    fact = {k: resolve(v, bound) for k, v in r.derive}
                    fact.setdefault("rank", first.get("rank"))
                    fid = f"h{next(self._fids)}"
                    self.sources[fid] = (facts, [*hyps, fact], [*via, r.id])
                    self.derived.append({"rule_id": r.id, "fact": fact})
                    c.assert_fact(clean(dict(fact, **{FID: fid})))
                    return
                self.conclusions.append(
                    {
                        "rule_id": r.id,
                        "root_cause": r.taxonomy,
                        "rank": first.get("rank"),
                        "function": resolve(r.function_ref, bound),
                        "rule_confidence": r.confidence,
                        "summary": _format(r.summary, {a: _public(f) for a, f in bound.items()}),
                        "fix_template": r.fix_template,
                        "basis": r.basis,
                        "needs": list(r.needs),
                        "missing_evidence_factor": r.missing_evidence_factor,
                        "facts": [_public(f) for f in facts],
                        "hypotheses": hyps,
                        "via": via,
                    }
                )
            except Exception as exc:
                self.errors.append(f"rule {r.id!r}: action failed: {exc!r}")

        return action

    def assert_facts(self, facts: list[dict[str, Any]]) -> None:
        rules = self.host.get_ruleset(self.name)
        if facts:
            dre.assert_facts(rules._handle, json.dumps([clean(f) for f in facts]))
        while True:
            res = dre.start_action(rules._handle)
            if not res:
                break
            rules._flush_actions(json.loads(res[0]), {"message": json.loads(res[1])}, res[2],
                                 lambda e, s: self.errors.append(repr(e)) if e else None)
        try:
            exc = self.host.get_state(self.name, "0").get("exception")
        except Exception:
            exc = None
        if exc:
            self.errors.append(f"engine reported: {exc}")
        if self.errors:
            raise RuleRuntimeError("; ".join(self.errors))

    def close(self) -> None:
        self.host.close()


class _Fmt(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class _Obj:
    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)

    def __getattr__(self, name: str) -> str:
        return "?"


def _format(template: str, bound: dict[str, dict[str, Any]]) -> str:
    try:
        return template.format_map(_Fmt({a: _Obj(d) for a, d in bound.items()}))
    except Exception:
        return template


def run_ir(rules: list[RuleIR], facts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Conclusions and derived facts of one run on a fresh host, as plain data for the trip back out of
    the worker process (`conclusion.typed_results` makes models of them on the other side)."""
    run = DurableRun(rules)
    try:
        run.assert_facts(facts)
        return list(run.conclusions), list(run.derived)
    finally:
        run.close()
