"""A site's overrides (`overrides/<site>.yaml`), validated like rules: every problem names the override
file and line, never the shipped rule it would have broken.

    overrides:
      <rule id>:
        reason: why this site differs       # required: `eroica rules list|show` print it
        disabled: true                    # drop the rule at this site
        confidence: 0.7                   # its prior here (wins over knowledge/priors.yaml)
        where: {<condition index or alias>: {<field>: <value> | {<op>: <value>}}}   # retune a threshold
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import RuleError
from eroica.engine.rules.ir import OPERATORS, THRESHOLD_OPS
from eroica.engine.rules.source import SAFE_LOADER, LoadedRule, line_map, line_of

KEYS = ("reason", "disabled", "confidence", "where")


@dataclass(frozen=True)
class Override:
    rule_id: str
    spec: dict[str, Any]
    path: str
    lines: dict[tuple[Any, ...], int]

    @property
    def reason(self) -> str:
        return " ".join(str(self.spec.get("reason") or "").split())

    def where(self, *loc: Any) -> str:
        """"file:line" of the override (or of one of its keys)."""
        key = ("overrides", self.rule_id, *(str(x) for x in loc))   # YAML keys are mapped as written
        return f"{self.path}:{line_of(self.lines, key)}"

    def at(self, *loc: Any) -> str:
        return f"{self.where(*loc)}: override for {self.rule_id!r}"


def load_override_files(paths: list[Path]) -> dict[str, Override]:
    """Every override of every file (a later file wins for the same rule); YAML and shape problems raised."""
    out: dict[str, Override] = {}
    problems: list[str] = []
    for p in paths:
        try:
            text = Path(p).read_text()
            node = yaml.compose(text, Loader=SAFE_LOADER)
            data = yaml.load(text, Loader=SAFE_LOADER) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problems.append(f"{p}{f':{mark.line + 1}' if mark else ''}: not valid YAML: {getattr(exc, 'problem', exc)}")
            continue
        except OSError as exc:
            problems.append(f"{p}: cannot read overrides: {exc.strerror}" + (
                "; a site directory goes with --knowledge DIR (its overrides/*.yaml are read)" if Path(p).is_dir()
                else ""))
            continue
        ov = data.get("overrides") if isinstance(data, dict) else None
        if not isinstance(ov, dict) or node is None:
            problems.append(f"{p}:1: expected a mapping `overrides: {{rule-id: {{disabled|confidence|where}}}}`")
            continue
        lines = line_map(node)
        for rid, spec in ov.items():
            o = Override(str(rid), spec if isinstance(spec, dict) else {}, str(p), lines)
            if not isinstance(spec, dict):
                problems.append(f"{o.at()}: expected a mapping of {', '.join(KEYS)}")
                continue
            out[str(rid)] = o
    if problems:
        raise RuleError(problems)
    return out


def validate(overrides: dict[str, Override], rules: dict[str, LoadedRule], vocab: dict[str, set[str]] | None = None,
             require_reason: bool = True) -> list[str]:
    """Unknown rule ids and keys, a missing reason, condition indices out of range, unknown fields and
    operators, values of the wrong type: each with the override's file and line. `vocab`: each fact
    kind's fields (default: the measured facts and the shipped hypotheses)."""
    if vocab is None:
        from eroica.engine.hypotheses import all_fact_types

        vocab = {k: set(m.model_fields) for k, m in all_fact_types().items()}
    out: list[str] = []
    for rid, o in overrides.items():
        lr = rules.get(rid)
        if lr is None:
            near = difflib.get_close_matches(rid, list(rules), n=3, cutoff=0.6)
            out.append(f"{o.at()}: no such rule" + (f"; closest: {', '.join(near)}" if near else "")
                       + "; every id: `eroica rules list`")
            continue
        if require_reason and not o.reason:
            out.append(f"{o.at()}: an override says why (`reason: ...`); `eroica rules list` shows it beside the rule")
        for k in o.spec:
            if k not in KEYS:
                out.append(f"{o.at(k)}: unknown key {k!r}; use {', '.join(KEYS)}")
        if "disabled" in o.spec and not isinstance(o.spec["disabled"], bool):
            out.append(f"{o.at('disabled')}: `disabled` is true or false, got {o.spec['disabled']!r}")
        c = o.spec.get("confidence")
        if "confidence" in o.spec and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1):
            out.append(f"{o.at('confidence')}: confidence is a number in [0, 1], got {c!r}")
        where = o.spec.get("where", {})
        if not isinstance(where, dict):
            out.append(f"{o.at('where')}: `where` maps a condition index to field tests")
            continue
        conds = lr.rule.when
        for key, fields in where.items():
            idx = condition_index(lr, key)
            if idx is None:
                aliases = [c.as_ for c in conds if c.as_]
                out.append(f"{o.at('where', key)}: no condition {key!r}; rule {rid!r} has conditions "
                           f"0..{len(conds) - 1}" + (f" (or by alias: {', '.join(aliases)})" if aliases else ""))
                continue
            kind = conds[idx].fact
            if not isinstance(fields, dict):
                out.append(f"{o.at('where', idx)}: expected {{field: value or {{op: value}}}}")
                continue
            for field, spec in fields.items():
                if field not in vocab.get(kind, set()):
                    out.append(f"{o.at('where', idx, field)}: condition {idx} matches {kind!r}, which has no field "
                               f"{field!r}; fields: {', '.join(sorted(vocab.get(kind, set())))}")
                    continue
                for op, val in (spec.items() if isinstance(spec, dict) else [("eq", spec)]):
                    if op not in OPERATORS:
                        out.append(f"{o.at('where', idx, field)}: unknown operator {op!r}; use one of "
                                   f"{', '.join(OPERATORS)}")
                    elif op in THRESHOLD_OPS and (isinstance(val, bool) or not isinstance(val, (int, float))):
                        out.append(f"{o.at('where', idx, field)}: `{op}` needs a number, got {val!r}")
    return out


def condition_index(lr: LoadedRule, key: Any) -> int | None:
    """The condition an override's `where` key names: its index (0 first) or its `as:` alias."""
    conds = lr.rule.when
    if isinstance(key, int) and not isinstance(key, bool):
        return key if 0 <= key < len(conds) else None
    return next((i for i, c in enumerate(conds) if c.as_ is not None and c.as_ == key), None)


def apply(lr: LoadedRule, o: Override | None, prior: float | None) -> tuple[LoadedRule, str]:
    """The rule as it runs: its fitted `prior` in place of the hand-set confidence, then the override's
    confidence and thresholds; and where its prior comes from, in words."""
    from eroica.engine.rules.schema import Rule

    hand = lr.rule.emit.confidence
    how = f"hand-set {hand:g} ({lr.path})"
    conf = hand
    if prior is not None:
        conf, how = prior, f"fitted {prior:g} on the incident library (knowledge/priors.yaml; hand-set {hand:g})"
    if o is not None and "confidence" in o.spec:
        conf, how = float(o.spec["confidence"]), f"{o.spec['confidence']:g} set by {o.at('confidence')}"
    where = (o.spec.get("where") or {}) if o is not None else {}
    if conf == hand and not where:
        return lr, how
    data = lr.rule.model_dump(by_alias=True)
    data["emit"]["confidence"] = conf
    for key, fields in where.items():
        data["when"][condition_index(lr, key)]["where"].update(fields)
    return LoadedRule(Rule.model_validate(data), lr.path, lr.lines), how
