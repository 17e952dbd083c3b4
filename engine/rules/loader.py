"""Load rule files and site overrides, collecting every problem (file, line, key, fix) before raising."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eroica.engine.errors import RuleError
from eroica.engine.rules.source import SAFE_LOADER, LoadedRule, builtin_rules_dir, duplicate_keys, line_map, line_of


def rule_files(paths: list[Path], strict: bool = False, problems: list[str] | None = None) -> list[Path]:
    """The rule files under `paths` (a file, or every *.yaml under a directory), in order. A missing
    path, a file that is not *.yaml and a *.yml or *.YAML under a directory are errors (a rule there
    would be skipped unseen); with `strict`, so is a path that holds no rule file at all. Raised, or,
    with `problems`, added to it and the good files returned."""
    out: list[Path] = []
    raise_them = problems is None
    problems = [] if problems is None else problems
    for p in paths:
        p = Path(p)
        if p.is_file():
            if p.suffix != ".yaml":
                problems.append(f"{p}: not a rule file: rule files end in .yaml"
                                + ("; rename it" if p.suffix in (".yml", ".YAML", ".Yaml") else ""))
                continue
            out.append(p)
        elif p.is_dir():
            found = sorted(x for x in p.rglob("*.yaml") if x.is_file() and x.name not in MISPLACED)
            problems += [f"{x}: rule files end in .yaml; rename it (a {x.suffix} file would never be loaded)"
                         for x in sorted(p.rglob("*")) if x.is_file() and x.suffix.lower() in (".yml", ".yaml")
                         and x.suffix != ".yaml"]
            if strict and not found:
                problems.append(f"{p}: holds no rule file (*.yaml); nothing to check")
            out.extend(found)
        else:
            problems.append(f"{p}: no such rule file or directory")
    if problems and raise_them:
        raise RuleError(problems)
    return out


#: a site directory's files that are not rules, wherever they are put (eroica.engine.rules.site_dirs says where)
MISPLACED = ("taxonomy.yaml", "hypotheses.yaml")


def parse_rule_file(path: Path) -> tuple[LoadedRule | None, list[str]]:
    from eroica.engine.rules.schema import RULE_SCHEMA, Rule

    try:
        text = path.read_text()
        node = yaml.compose(text, Loader=SAFE_LOADER)
        data = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        return None, [f"{path}{line}: not valid YAML: {getattr(exc, 'problem', exc)}; fix the syntax"]
    except OSError as exc:
        return None, [f"{path}: cannot read: {exc.strerror}"]
    if not isinstance(data, dict) or node is None:
        return None, [f"{path}:1: a rule file must be a mapping with `schema: {RULE_SCHEMA}`"]
    if "overrides" in data and "schema" not in data:
        return None, [f"{path}:1: an override file, not a rule: pass it with --overrides, or put it in a site "
                      "directory's overrides/ (--knowledge DIR)"]
    lines = line_map(node)
    dups = duplicate_keys(node)
    if dups:
        return None, [f"{path}:{line}: key {key!r} appears twice in one mapping (YAML keeps the last, silently); "
                      "keep one" for key, line in dups]
    if data.get("schema") != RULE_SCHEMA:
        return None, [f"{path}:{line_of(lines, ('schema',))}: key 'schema': expected {RULE_SCHEMA!r}, "
                      f"got {data.get('schema')!r}; add `schema: {RULE_SCHEMA}` as the first key"]
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(x) for x in loc) or "(top)"
            fix = ("remove it or check its spelling" if err["type"] == "extra_forbidden"
                   else "the rule format: docs/rule-authoring.md")
            problems.append(f"{path}:{line_of(lines, loc)}: rule {data.get('id', '?')!r}, key {key!r}: "
                            f"{err['msg']}; {fix}")
        return None, problems
    if path.stem != rule.id.split(".", 1)[1].replace("-", "_"):
        return None, [f"{path}:{line_of(lines, ('id',))}: rule {rule.id!r}: file name must be the id tail "
                      f"({rule.id.split('.', 1)[1].replace('-', '_')}.yaml)"]
    return LoadedRule(rule, str(path), lines), []


def load_overrides(paths: list[Path]) -> dict[str, Any]:
    """The overrides of these files, validated against the rules when `load_rules` applies them."""
    from eroica.engine.rules.overrides import load_override_files

    return dict(load_override_files(paths))


def load_rules(paths: list[Path] | None = None, overrides: dict[str, Any] | None = None,
               priors: dict[str, float] | None = None) -> list[LoadedRule]:
    """Every rule under `paths` (no layers: eroica.engine.rules.layers builds what commands run on);
    `priors` (fitted, knowledge/priors.yaml) replace the hand-set confidences of the rules they name,
    and `overrides` apply last."""
    files = rule_files(paths or [builtin_rules_dir()])
    loaded: list[LoadedRule] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for f in files:
        lr, probs = parse_rule_file(f)
        problems.extend(probs)
        if lr is None:
            continue
        if lr.rule.id in seen:
            problems.append(f"{f}: rule id {lr.rule.id!r} already used by {seen[lr.rule.id]}; ids are never reused")
            continue
        seen[lr.rule.id] = f.as_posix()
        loaded.append(lr)
    if problems:
        raise RuleError(problems)
    from eroica.engine.rules.overrides import Override, apply, validate

    sourced = {k: v if isinstance(v, Override) else Override(k, v if isinstance(v, dict) else {}, "(overrides)", {})
               for k, v in (overrides or {}).items()}
    problems = validate(sourced, {lr.rule.id: lr for lr in loaded}, require_reason=False)
    if problems:
        raise RuleError(problems)
    out = []
    for lr in loaded:
        o = sourced.get(lr.rule.id)
        if (o and o.spec.get("disabled")) or lr.rule.status.value == "deprecated":
            continue
        out.append(apply(lr, o, (priors or {}).get(lr.rule.id))[0])
    return out
