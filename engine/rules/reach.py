"""Rules that can never fire, found before they are loaded: a literal outside the values its field can
take (a category, a hardware signal, a hang state no collector produces), a literal of the wrong type,
a threshold outside the field's range (a share above 1, a negative rate), tests on one field that no
value passes, a fact kind that nothing in the loaded knowledge produces (a hypothesis no enabled rule
derives), window and hang facts in one rule, an evidence source (`emit.needs`) no collector names, and
a root cause the taxonomy does not have.

The compile path (eroica.engine.rules.layers) runs these on every rule it loads, so `eroica rules lint`,
`rules test`, `diagnose`, `eval` and `serve` refuse the same rules with the same messages: file and
line, the bad value, and the closest valid names.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

from eroica.engine.rules.ir import PatternIR, RuleIR, TestIR
from eroica.engine.rules.source import LoadedRule, line_of
from eroica.engine.rules.vocabulary import SIGNAL_VALUED, FieldSpec, Vocabulary

_SHOWN = 12      # valid names listed in a message, beyond the closest ones
DOMAIN_WORDS = {"category": "a category the engine states", "signal": "a hardware signal a collector produces",
                "metric": "a metric the collector records", "gap_source": "a source the collector records gaps for",
                "state": "a hang state the engine states"}


def closest(value: Any, valid: Iterable[str]) -> str:
    """"closest: a, b; valid: ..." for a message: names that start with the value's first word, then
    the most similar spellings."""
    names = list(valid)
    head = str(value).split("_", 1)[0]
    near = [n for n in names if n.split("_", 1)[0] == head and n != value][:3]
    near += [n for n in difflib.get_close_matches(str(value), names, n=3, cutoff=0.5) if n not in near]
    near = near[:3]
    shown = ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
    return (f"closest: {', '.join(near)}; " if near else "") + f"valid: {shown}"


def producible(rules: list[RuleIR], vocab: Vocabulary) -> set[str]:
    """The fact kinds the loaded knowledge can state: every measured kind, and each hypothesis that a
    rule derives from kinds that are themselves producible (a chain broken by a disabled rule, or a
    cycle, produces nothing)."""
    have = {k for k, s in vocab.kinds.items() if not s.hypothesis}
    changed = True
    while changed:
        changed = False
        for r in rules:
            k = r.derived_kind
            if k and k not in have and all(p.kind in have for p in r.patterns):
                have.add(k)
                changed = True
    return have


def _type_ok(spec: FieldSpec, value: Any) -> bool:
    base = spec.type.rstrip("?")
    if value is None:
        return spec.type.endswith("?")
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    return True


def _bounds(spec: FieldSpec, pattern: PatternIR, vocab: Vocabulary) -> tuple[float | None, float | None, str]:
    """The field's range, where the rule pins it: hw_signal's value is in its signal's unit and range."""
    if pattern.kind == "hw_signal" and spec.name in SIGNAL_VALUED:
        pinned = [t.value for t in pattern.tests if t.field == "signal" and t.op in ("eq", "in")]
        names = [n for v in pinned for n in (v if isinstance(v, list) else [v])]
        sigs = [vocab.signal(str(n)) for n in names]
        if sigs and all(s is not None for s in sigs):
            lows = [s.low for s in sigs if s is not None]
            highs = [s.high for s in sigs if s is not None]
            low = None if any(x is None for x in lows) else min(x for x in lows if x is not None)
            high = None if any(x is None for x in highs) else max(x for x in highs if x is not None)
            return low, high, f"the range of {', '.join(map(str, names))}"
        return None, None, ""
    return spec.low, spec.high, f"the range of {pattern.kind}.{spec.name}"


def _interval(tests: list[TestIR]) -> tuple[float, bool, float, bool]:
    """The values that pass every threshold of one field: (low, low inclusive, high, high inclusive)."""
    lo, lo_in, hi, hi_in = -math.inf, True, math.inf, True
    for t in tests:
        v = float(t.value)
        if t.op in ("gt", "gte") and (v > lo or (v == lo and t.op == "gt")):
            lo, lo_in = v, t.op == "gte"
        elif t.op in ("lt", "lte") and (v < hi or (v == hi and t.op == "lt")):
            hi, hi_in = v, t.op == "lte"
        elif t.op == "eq":
            if not (lo < v or (lo == v and lo_in)) or not (v < hi or (v == hi and hi_in)):
                return 1.0, False, 0.0, False
            lo, lo_in, hi, hi_in = v, True, v, True
    return lo, lo_in, hi, hi_in


def _empty(lo: float, lo_in: bool, hi: float, hi_in: bool) -> bool:
    return lo > hi or (lo == hi and not (lo_in and hi_in))


def _test_problems(t: TestIR, spec: FieldSpec, pattern: PatternIR, vocab: Vocabulary) -> list[str]:
    values = t.value if t.op == "in" else [t.value]
    out: list[str] = []
    for v in values:
        if not _type_ok(spec, v):
            out.append(f"{v!r} is not a {spec.type} ({pattern.kind}.{spec.name} is a {spec.type}): it never matches")
        elif spec.values and isinstance(v, str) and v not in spec.values:
            what = DOMAIN_WORDS.get(spec.domain or "", "one of the values the rules that derive it set")
            out.append(f"{v!r} is not {what} ({pattern.kind}.{spec.name}); {closest(v, spec.values)}; "
                       "see `eroica rules vocabulary`")
    # a measured number equals a given one almost never; 0 is the exception (none of it: no throttling)
    if t.op in ("eq", "in") and spec.type.rstrip("?") == "float" and any(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0 for v in values):
        out.append(f"`{t.op}` compares the measured {pattern.kind}.{spec.name} with {t.value!r} exactly: it almost "
                   f"never matches; a threshold is `{{gte: {values[0]!r}}}` or `{{lte: ...}}`")
    if t.op in ("gt", "gte", "lt", "lte", "eq", "in") and spec.numeric:
        low, high, what = _bounds(spec, pattern, vocab)
        for v in values:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if (low is not None and v < low) or (high is not None and v > high):
                out.append(f"threshold {v!r} is outside {what} ({_fmt(low, -1)}..{_fmt(high, 1)}): a share is "
                           "0..1, a rate or a duration is never negative; check the unit")
            elif (t.op == "gt" and high is not None and v >= high) or (t.op == "lt" and low is not None and v <= low):
                out.append(f"`{t.op}: {v!r}` can never hold: {what} is {_fmt(low, -1)}..{_fmt(high, 1)}")
    return out


def _fmt(x: float | None, side: int) -> str:
    return ("-inf" if side < 0 else "inf") if x is None else f"{x:g}"


def rule_problems(lr: LoadedRule, ir: RuleIR, vocab: Vocabulary, have: set[str],
                  where_override: dict[tuple[int, str], str] | None = None) -> list[str]:
    """Why this compiled rule can never fire (none: it can); `where_override`: (condition, field) ->
    the override file and line that set that field's test, named beside the rule's own line."""
    r = lr.rule
    out: list[str] = []

    def bad(loc: tuple[Any, ...], msg: str) -> None:
        note = ""
        if where_override and len(loc) == 4 and (loc[1], loc[3]) in where_override:
            note = f" (as overridden at {where_override[(loc[1], loc[3])]})"
        out.append(f"{lr.path}:{line_of(lr.lines, loc)}: rule {r.id!r}, key {'.'.join(map(str, loc))!r}{note}: {msg}")

    contexts: dict[str, str] = {}
    for i, p in enumerate(ir.patterns):
        ks = vocab.kinds.get(p.kind)
        if ks is None:
            continue
        if p.kind not in have:
            why = ("no enabled rule derives it" if not ks.derived_by else
                   f"the rules that derive it ({', '.join(ks.derived_by)}) can never fire themselves")
            bad(("when", i, "fact"), f"hypothesis {p.kind!r} is never stated: {why}; load the knowledge that "
                                     "derives it (--knowledge) or derive it in a rule of your own")
        contexts.setdefault(ks.context, p.kind)
        by_field: dict[str, list[TestIR]] = {}
        for t in p.tests:
            spec = ks.fields.get(t.field)
            if spec is None:
                continue
            for msg in _test_problems(t, spec, p, vocab):
                bad(("when", i, "where", t.field), msg)
            if spec.numeric and t.op in ("gt", "gte", "lt", "lte", "eq") and isinstance(t.value, (int, float)):
                by_field.setdefault(t.field, []).append(t)
        for field, tests in by_field.items():
            if len(tests) > 1 and _empty(*_interval(tests)):
                bad(("when", i, "where", field), "no value passes all of "
                    + ", ".join(f"{t.op} {t.value!r}" for t in tests))
    if len(contexts) > 1:
        bad(("when",), "it matches " + " and ".join(f"{k!r} (stated in a {c})" for c, k in contexts.items())
            + ": a window's facts and a hang's are never stated together")
    for j, need in enumerate(r.emit.needs):
        if need not in vocab.gap_sources:
            bad(("emit", "needs", j), f"{need!r} is not a source a collector records a gap for; "
                                      f"{closest(need, vocab.gap_sources)}")
    if r.taxonomy and r.taxonomy not in vocab.root_causes:
        bad(("taxonomy",), f"unknown root cause {r.taxonomy!r}; add it to your site's taxonomy.yaml "
                           f"(--knowledge DIR) or use one of the taxonomy's; {closest(r.taxonomy, vocab.root_causes)}")
    return out
