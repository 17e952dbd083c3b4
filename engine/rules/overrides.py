"""A site's overrides (`overrides/<site>.yaml`), validated like rules: every problem names the override
file and line, never the shipped rule it would have broken.

    overrides:
      <rule id>:
        disabled: true                    # drop the rule at this site
        confidence: 0.7                   # its prior here (wins over knowledge/priors.yaml)
        where: {<condition index>: {<field>: <value> | {<op>: <value>}}}   # retune a threshold
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import RuleError
from eroica.engine.rules.ir import OPERATORS, THRESHOLD_OPS
from eroica.engine.rules.source import SAFE_LOADER, LoadedRule, line_map, line_of

KEYS = ("disabled", "confidence", "where")


@dataclass(frozen=True)
class Override:
    rule_id: str
    spec: dict[str, Any]
    path: str
    lines: dict[tuple[Any, ...], int]

    def at(self, *loc: Any) -> str:
        key = ("overrides", self.rule_id, *(str(x) for x in loc))   # YAML keys are mapped as written
        return f"{self.path}:{line_of(self.lines, key)}: override for {self.rule_id!r}"


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
            problems.append(f"{p}: cannot read overrides: {exc.strerror}")
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


def validate(overrides: dict[str, Override], rules: dict[str, LoadedRule], vocab: dict[str, set[str]]) -> list[str]:
    """Unknown rule ids and keys, condition indices out of range, unknown fields and operators, values
    of the wrong type: each with the override's file and line."""
    out: list[str] = []
    for rid, o in overrides.items():
        lr = rules.get(rid)
        if lr is None:
            out.append(f"{o.at()}: no such rule; known ids: see `eroica rules lint` or knowledge/rules/")
            continue
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
        for idx, fields in where.items():
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(conds):
                out.append(f"{o.at('where', idx)}: condition index {idx!r} out of range; rule {rid!r} has "
                           f"conditions 0..{len(conds) - 1}")
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
