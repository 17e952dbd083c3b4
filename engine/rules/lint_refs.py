"""Lint checks that reach past one rule's own schema: the facts its tests are given, the fields its
summary names, and the things it refers to (remediation templates, runbooks, incidents)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from eroica.engine.hypotheses import all_fact_types
from eroica.engine.rules.source import LoadedRule, builtin_knowledge_dir, line_of
from eroica.engine.rules.vocabulary import SIGNAL_VALUED, Vocabulary

SUMMARY_FIELD = re.compile(r"\{([a-z_]+)\.([a-z_0-9]+)")


def given_problems(lr: LoadedRule, vocab: dict[str, set[str]], site_dirs: list[Path] | None = None,
                   vocabulary: Vocabulary | None = None, types: dict[str, Any] | None = None) -> list[str]:
    """Each test's `given:` facts against the fact models (measured facts and declared hypotheses):
    unknown kind, unknown field, wrong type; and, with the `vocabulary`, a value no collector or rule
    states (a category, a signal, a share above 1): a test of a fact that never happens."""
    types = types or all_fact_types(site_dirs)
    out: list[str] = []
    for ti, t in enumerate(lr.rule.tests):
        for gi, g in enumerate(t.given):
            kind = g.get("kind")
            where = f"{lr.path}:{line_of(lr.lines, ('tests', ti, 'given', gi))}: rule {lr.rule.id!r} test {t.name!r}"
            if kind not in vocab:
                out.append(f"{where}: given fact of unknown kind {kind!r}; kinds: {', '.join(sorted(vocab))}")
                continue
            model = types.get(str(kind))
            for field, value in g.items():
                if field not in vocab[kind]:
                    out.append(f"{where}: fact {kind!r} has no field {field!r}; fields: "
                               f"{', '.join(sorted(vocab[kind]))}")
                elif model is not None and field != "kind" and (ann := model.model_fields[field].annotation):
                    try:
                        TypeAdapter(ann).validate_python(value)
                    except ValidationError as exc:
                        out.append(f"{where}: {kind}.{field} = {value!r} is not a valid "
                                   f"{model.model_fields[field].annotation}: {exc.errors()[0]['msg']}")
                        continue
                    if vocabulary is not None:
                        out += [f"{where}: {msg}" for msg in _impossible(vocabulary, str(kind), field, value, g)]
    return out


def _impossible(vocabulary: Vocabulary, kind: str, field: str, value: Any, fact: dict[str, Any]) -> list[str]:
    from eroica.engine.rules.reach import closest

    spec = vocabulary.field(kind, field)
    if spec is None:
        return []
    if spec.values and isinstance(value, str) and value not in spec.values:
        return [f"{kind}.{field} = {value!r} is never stated; {closest(value, spec.values)}"]
    low, high = spec.low, spec.high
    if kind == "hw_signal" and field in SIGNAL_VALUED:
        sig = vocabulary.signal(str(fact.get("signal")))
        low, high = (sig.low, sig.high) if sig is not None else (None, None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            (low is not None and value < low) or (high is not None and value > high)):
        return [f"{kind}.{field} = {value!r} is outside its range ({low if low is not None else '-inf'}.."
                f"{high if high is not None else 'inf'}); check the unit"]
    return []


def summary_problems(lr: LoadedRule, vocab: dict[str, set[str]]) -> list[str]:
    """A summary that names a field its fact does not have would print a raw template at run time."""
    aliases = {c.as_: c.fact for c in lr.rule.when if c.as_}
    out = []
    for alias, field in SUMMARY_FIELD.findall(lr.rule.emit.summary):
        fact = aliases.get(alias)
        if fact is not None and field not in vocab.get(fact, set()):
            out.append(f"{lr.path}:{line_of(lr.lines, ('emit', 'summary'))}: rule {lr.rule.id!r}: the summary "
                       f"names {{{alias}.{field}}} but fact {fact!r} has no field {field!r}")
    return out


def reference_problems(lr: LoadedRule, knowledge_dir: Path | None = None,
                       incidents_dir: Path | None = None, site_dir: Path | None = None) -> list[str]:
    """Dangling references: a fix template without a remediation, a runbook that is not there, an
    incident that was never recorded (checked where an incident library is beside the knowledge)."""
    kdir = knowledge_dir or builtin_knowledge_dir()
    r, out = lr.rule, []
    tmpl: Any = r.emit.fix_template
    if tmpl and not (kdir / "remediations" / f"{tmpl}.yaml").exists():
        out.append(f"{lr.path}:{line_of(lr.lines, ('emit', 'fix_template'))}: rule {r.id!r}: fix_template "
                   f"{tmpl!r} has no knowledge/remediations/{tmpl}.yaml; write it or name an existing one")
    for ref in r.references:
        if "://" in ref:
            continue
        where = (kdir / ref.removeprefix("knowledge/") if ref.startswith("knowledge/")
                 else site_dir / ref if site_dir is not None else None)
        if where is not None and not where.exists():
            out.append(f"{lr.path}:{line_of(lr.lines, ('references',))}: rule {r.id!r}: reference {ref!r} "
                       f"does not exist ({where}); write it, or give a URL")
    incidents = incidents_dir if incidents_dir is not None else kdir.parent / "incidents"
    if incidents.is_dir():
        for inc in r.incidents:
            if not (incidents / inc / "expected.yaml").exists():
                out.append(f"{lr.path}:{line_of(lr.lines, ('incidents',))}: rule {r.id!r}: incident {inc!r} "
                           f"is not in {incidents}")
    return out


def _differs_only_at(quiet: list[dict[str, Any]], firing: list[dict[str, Any]], kind: str, field: str) -> bool:
    """The quiet test's facts are the firing test's, but for `field` of one `kind` fact."""
    if len(quiet) != len(firing):
        return False
    changed = 0
    for q, f in zip(quiet, firing):
        if q == f:
            continue
        if q.get("kind") != kind or f.get("kind") != kind or set(q) != set(f):
            return False
        if {k for k in q if q[k] != f[k]} != {field}:
            return False
        changed += 1
    return changed == 1


def boundary_problems(lr: LoadedRule, threshold_ops: tuple[str, ...], cmp: dict[str, Any],
                      sources: Callable[[str, str], list[tuple[str, str]]] | None = None) -> list[str]:
    """Each threshold needs its own quiet test: a firing test's facts with only that field moved
    across the boundary (so the test proves that threshold, not another condition failing). A
    threshold on a hypothesis's field may be moved on the hypothesis or on the measured field it is
    copied from (`sources`), since tests run through the chain."""
    srcs = sources or (lambda k, f: [(k, f)])
    r, out = lr.rule, []
    firing = [t for t in r.tests if t.expect]
    quiet = [t for t in r.tests if not t.expect]
    for i, cond in enumerate(r.when):
        for field, spec in cond.where.items():
            if not isinstance(spec, dict):
                continue
            for op, val in spec.items():
                if op not in threshold_ops or not isinstance(val, (int, float)) or isinstance(val, bool):
                    continue
                ok = any(_differs_only_at(list(q.given), list(f.given), k, fld)
                         and any(g.get("kind") == k and fld in g and not cmp[op](g[fld], val) for g in q.given)
                         for k, fld in srcs(cond.fact, field) for q in quiet for f in firing)
                if not ok:
                    out.append(f"{lr.path}:{line_of(lr.lines, ('when', i, 'where', field))}: rule {r.id!r}: "
                               f"threshold {cond.fact}.{field} {op} {val} has no quiet test that differs from a "
                               f"firing test only there; copy a firing test and move {field} across {val}")
    return out
