"""Rules -> an engine-neutral intermediate form, checked against the fact vocabulary.

The back end (durable-rules today) only sees `RuleIR`. The compiler refuses what the back end
cannot run safely: joins are equality-only (non-equality joins can read out of bounds in
durable-rules), operators are a closed set, every field must exist on its fact kind, and every
`$alias.field` reference must be bound by an earlier condition.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from eroica.engine.errors import RuleCompileError
from eroica.engine.facts import FACT_TYPES
from eroica.engine.hypotheses import all_fact_types
from eroica.engine.rules.ir import OPERATORS, REF, THRESHOLD_OPS, VAR, JoinIR, PatternIR, RuleIR, TestIR
from eroica.engine.rules.source import LoadedRule, line_of


def fact_fields(site_dirs: list[Path] | None = None) -> dict[str, set[str]]:
    """The vocabulary rules are written in: every measured fact kind and declared hypothesis, with its fields."""
    return {k: set(m.model_fields) for k, m in all_fact_types(site_dirs).items()}


def compile_rule(lr: LoadedRule, vocab: dict[str, set[str]]) -> tuple[RuleIR | None, list[str]]:
    r = lr.rule
    problems: list[str] = []

    def bad(loc: tuple[Any, ...], msg: str) -> None:
        problems.append(f"{lr.path}:{line_of(lr.lines, loc)}: rule {r.id!r}, key {'.'.join(map(str, loc))!r}: {msg}")

    bound: dict[str, tuple[str, str]] = {}     # variable -> (alias, field)
    uses: dict[str, list[tuple[Any, ...]]] = {}  # variable -> where it stands
    aliases: dict[str, str] = {}               # alias -> kind
    patterns: list[PatternIR] = []
    for i, cond in enumerate(r.when):
        alias = cond.as_ or f"c{i}"
        if alias in aliases:
            bad(("when", i, "as"), f"alias {alias!r} used twice; give each condition its own `as`")
        if cond.fact not in vocab:
            if cond.as_:
                aliases[cond.as_] = cond.fact         # known to the summary: no second problem for one typo
            near = difflib.get_close_matches(cond.fact, list(vocab), n=3, cutoff=0.6)
            bad(("when", i, "fact"), f"unknown fact kind {cond.fact!r}; " + (f"closest: {', '.join(near)}; " if near
                                     else "") + f"known: {', '.join(sorted(vocab))}")
            continue
        tests: list[TestIR] = []
        joins: list[JoinIR] = []
        for field, spec in cond.where.items():
            loc = ("when", i, "where", field)
            if field not in vocab[cond.fact]:
                bad(loc, f"fact {cond.fact!r} has no field {field!r}; fields: {', '.join(sorted(vocab[cond.fact]))}")
                continue
            if isinstance(spec, str) and VAR.match(spec):
                var = spec[1:]
                uses.setdefault(var, []).append(loc)
                if var in bound:
                    a, f = bound[var]
                    joins.append(JoinIR(field, a, f))
                else:
                    bound[var] = (alias, field)
                continue
            ops = spec.items() if isinstance(spec, dict) else [("eq", spec)]
            for op, val in ops:
                if op not in OPERATORS:
                    bad(loc, f"unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
                    continue
                if isinstance(val, str) and val.startswith("$"):
                    bad(loc, f"{op} against {val!r}: joins must be equality-only (`{field}: {val}`); "
                             "compare against constants, or precompute the ratio into the fact")
                    continue
                if op == "in" and not (isinstance(val, list) and val):
                    bad(loc, "`in` needs a non-empty list of values")
                    continue
                if op in THRESHOLD_OPS and (isinstance(val, bool) or not isinstance(val, (int, float))):
                    bad(loc, f"`{op}` needs a number, got {val!r}")
                    continue
                tests.append(TestIR(field, op, val))
        aliases[alias] = cond.fact
        patterns.append(PatternIR(alias, cond.fact, tuple(tests), tuple(joins)))

    def check_ref(value: Any, loc: tuple[Any, ...]) -> None:
        if isinstance(value, str) and value.startswith("$"):
            m = REF.match(value)
            if not m:
                bad(loc, f"reference {value!r} must look like `$alias.field`")
            elif m.group(1) not in aliases:
                bad(loc, f"reference {value!r}: no condition has `as: {m.group(1)}`")
            elif m.group(2) not in vocab.get(aliases[m.group(1)], set()):
                bad(loc, f"reference {value!r}: fact {aliases[m.group(1)]!r} has no field {m.group(2)!r}")

    # two conditions binding the same field to different variables used once each join nothing: a typo
    # ($rank and $rnk) leaves the rule matching any pair of ranks
    once: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    for var, locs in uses.items():
        if len(locs) == 1:
            once.setdefault(str(locs[0][-1]), []).append((var, locs[0]))
    for field, vs in once.items():
        for var, loc in vs[1:]:
            bad(loc, f"${var} and ${vs[0][0]} each bind {field!r} in one condition and join nothing: a typo? (the "
                     f"same $name in both conditions makes them the same {field})")
    check_ref(r.emit.function, ("emit", "function"))
    derive = None
    if r.emit.derive is not None:
        if not isinstance(r.emit.derive.get("kind"), str):
            bad(("emit", "derive"), "a derived fact needs `kind: <name>`")
        for k, v in r.emit.derive.items():
            check_ref(v, ("emit", "derive", k))
        kind = r.emit.derive.get("kind")
        if kind in FACT_TYPES:
            bad(("emit", "derive", "kind"), f"{kind!r} is a measured fact; a rule derives a hypothesis")
        elif isinstance(kind, str) and kind not in vocab:
            bad(("emit", "derive", "kind"), f"hypothesis {kind!r} is not declared; declare its fields and types in "
                                            "knowledge/hypotheses.yaml (or your site's hypotheses.yaml)")
        elif isinstance(kind, str):
            declared = vocab[kind] - {"kind", "rank"}
            given = set(r.emit.derive) - {"kind", "rank"}
            if declared - given:
                bad(("emit", "derive"), f"hypothesis {kind!r} needs {', '.join(sorted(declared - given))}")
            if given - declared:
                bad(("emit", "derive"), f"hypothesis {kind!r} has no field(s) {', '.join(sorted(given - declared))}; "
                                        f"its fields: {', '.join(sorted(declared))}")
        derive = tuple(sorted(r.emit.derive.items()))
    for var in re.findall(r"\{([a-z_]+)\.", r.emit.summary):
        if var not in aliases:
            bad(("emit", "summary"), f"summary uses {{{var}.…}} but no condition has `as: {var}`")
    if problems:
        return None, problems
    return (
        RuleIR(
            id=r.id, taxonomy=r.taxonomy or "", patterns=tuple(patterns), confidence=r.emit.confidence,
            summary=r.emit.summary, function_ref=r.emit.function, fix_template=r.emit.fix_template, derive=derive,
            basis=r.emit.basis, needs=tuple(r.emit.needs), missing_evidence_factor=r.emit.missing_evidence_factor,
            status=r.status.value,
        ),
        [],
    )


def with_derivations(ir: RuleIR, rules: list[RuleIR]) -> tuple[RuleIR, ...]:
    """The rule, then every rule that derives a hypothesis it consumes, transitively: what its tests run."""
    by_kind: dict[str, list[RuleIR]] = {}
    for r in rules:
        if r.derived_kind:
            by_kind.setdefault(r.derived_kind, []).append(r)
    out: list[RuleIR] = [ir]
    todo = [p.kind for p in ir.patterns]
    while todo:
        for r in by_kind.get(todo.pop(), []):
            if r not in out:
                out.append(r)
                todo += [p.kind for p in r.patterns]
    return tuple(out)


def trace_field(kind: str, field: str, rules: list[RuleIR]) -> list[tuple[str, str]]:
    """(kind, field), then the measured facts' fields a hypothesis's field is copied from, transitively:
    a threshold on a derived field is tested by moving the measured field it comes from."""
    out = [(kind, field)]
    for r in rules:
        if r.derived_kind != kind:
            continue
        m = REF.match(str(dict(r.derive or ()).get(field, "")))
        src = next((p.kind for p in r.patterns if m and p.alias == m.group(1)), None)
        if m and src:
            out += [x for x in trace_field(src, m.group(2), rules) if x not in out]
    return out


def compile_each(rules: list[LoadedRule], site_dirs: list[Path] | None = None,
                 vocab: dict[str, set[str]] | None = None) -> tuple[list[tuple[LoadedRule, RuleIR]], list[str]]:
    """Compile every rule against one vocabulary (`vocab`: each kind's fields; default: the measured
    facts and the hypotheses of `site_dirs`); (rule, IR) pairs for those that compiled, all problems."""
    vocab = vocab if vocab is not None else fact_fields(site_dirs)
    out: list[tuple[LoadedRule, RuleIR]] = []
    problems: list[str] = []
    for lr in rules:
        ir, probs = compile_rule(lr, vocab)
        problems.extend(probs)
        if ir is not None:
            out.append((lr, ir))
    return out, problems


def compile_rules(rules: list[LoadedRule], site_dirs: list[Path] | None = None) -> list[RuleIR]:
    compiled, problems = compile_each(rules, site_dirs)
    if problems:
        raise RuleCompileError(problems)
    return [ir for _, ir in compiled]
