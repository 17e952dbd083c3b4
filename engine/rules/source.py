"""Rule files as they are read: the YAML loader, where each value sits (a line map, for messages that
name the line), the loaded rule, the knowledge directories, and versioned knowledge data files. The
rule loader, its overrides and the knowledge data modules all read through this one module."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eroica.engine.errors import RuleError

if TYPE_CHECKING:       # the rule schema's models are built on first use: a cached rule base never needs them
    from eroica.engine.rules.schema import Rule

#: libyaml's parser where PyYAML was built with it (several times faster), else the pure-Python one
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class LoadedRule:
    rule: Rule
    path: str
    lines: dict[tuple[Any, ...], int]   # loc path -> 1-based line, for messages


def builtin_knowledge_dir() -> Path:
    return Path(str(resources.files("eroica.knowledge")))


def builtin_rules_dir() -> Path:
    return builtin_knowledge_dir() / "rules"


def line_map(node: yaml.Node, prefix: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    out = {prefix: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[prefix + (key,)] = k.start_mark.line + 1
            out.update(line_map(v, prefix + (key,)))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.update(line_map(v, prefix + (i,)))
    return out


def duplicate_keys(node: yaml.Node) -> list[tuple[str, int]]:
    """(key, line) of every key a mapping of the document holds twice."""
    out: list[tuple[str, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if str(k.value) in seen:
                out.append((str(k.value), k.start_mark.line + 1))
            seen.add(str(k.value))
            out += duplicate_keys(v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            out += duplicate_keys(v)
    return out


def line_of(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int:
    loc = tuple("as" if x == "as_" else ("schema" if x == "schema_" else x) for x in loc)
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def load_data_file(path: Path, schema: str, fix: str) -> dict[str, Any]:
    """A versioned knowledge data file (hypotheses, priors): its mapping, or a RuleError naming the file
    and, for a wrong or missing `schema:`, what to do (`fix`)."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=SAFE_LOADER) or {}
    except yaml.YAMLError as exc:
        raise RuleError([f"{path}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise RuleError([f"{path}: expected a mapping with `schema: {schema}`; {fix}"])
    return data
