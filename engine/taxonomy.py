"""The taxonomy as the engine reads it: root causes, how findings on one rank are reconciled
(`resolution`, `superseded_by`, `explained_by`, `generic`, `decided_by`), and the coverage floor.

All of it is data in `knowledge/taxonomy.yaml` (a site adds root causes in its own); nothing here
names a root cause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import RuleError
from eroica.engine.facts import FACT_TYPES
from eroica.engine.rules.ir import OPERATORS
from eroica.engine.rules.source import SAFE_LOADER, builtin_knowledge_dir


@dataclass(frozen=True)
class Decider:
    """Evidence that tells a root cause apart from another at close confidence on the same rank
    (eroica.engine.verdicts): a fact of kind `fact` on the rank whose fields have the values in
    `where` (a value, or {operator: value} with the rules' operators); `says`: the evidence in words, formatted
    with the fact's fields."""

    fact: str
    where: dict[str, Any]
    says: str

    @classmethod
    def parse(cls, v: Any, cause: str) -> Decider:
        if not isinstance(v, dict) or set(v) - {"fact", "where", "says"} or not isinstance(v.get("fact"), str):
            raise TypeError(f"root cause {cause!r}: decided_by takes {{fact, where, says}} items, got {v!r}")
        where = v.get("where") or {}
        bad = [k for k, t in where.items() if isinstance(t, dict) and set(t) - set(OPERATORS)]
        if not isinstance(where, dict) or bad:
            raise TypeError(f"root cause {cause!r}: decided_by {v['fact']}: where {bad or where!r} uses an operator "
                            f"other than {', '.join(OPERATORS)}")
        return cls(fact=v["fact"], where=dict(where), says=str(v.get("says") or ""))

    @property
    def condition(self) -> str:
        """What deciding takes, as a person reads it ("fact with field >= value, ...")."""
        def cond(k: str, t: Any) -> str:
            signs = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<", "eq": "=", "ne": "!=", "in": "in"}
            return " and ".join(f"{k} {signs[o]} {x}" for o, x in t.items()) if isinstance(t, dict) else f"{k} = {t}"
        return f"{self.fact} with " + ", ".join(cond(k, t) for k, t in self.where.items()) if self.where else self.fact

    def describe(self, fact: Any) -> str:
        try:
            return self.says.format(**fact.model_dump()) if self.says else self.condition
        except (KeyError, ValueError, IndexError):
            return self.condition


@dataclass(frozen=True)
class TaxonomyEntry:
    category: str
    component: str
    question: str
    runbook: str
    generic: bool = False     # a catch-all explanation, explained away by a specific one
    explained_by: tuple[str, ...] = ()   # causes that explain this one away on the same rank
    superseded_by: tuple[str, ...] = ()  # causes that replace it on the same rank ("*": any other)
    unhealthy_at: float | None = None    # confidence that makes a window unhealthy (default: resolution's)
    names_top_function: bool = False     # with no function from its rule, name the rank's top excess function
    located_cost: bool = False           # it costs the part of the rank's excess its rule located, not all of it
    decided_by: tuple[Decider, ...] = ()  # what tells it apart from another cause at close confidence

    @classmethod
    def parse(cls, v: dict[str, Any], cause: str = "?") -> TaxonomyEntry:
        return cls(**{**v, "explained_by": tuple(v.get("explained_by", ())),
                      "superseded_by": tuple(v.get("superseded_by", ())),
                      "decided_by": tuple(Decider.parse(d, cause) for d in v.get("decided_by", ()))})


@dataclass(frozen=True)
class Resolution:
    """How findings on the same rank are reconciled (knowledge/taxonomy.yaml `resolution`)."""

    explained_away_factor: float = 0.5
    unhealthy_at: float = 0.5
    contest_margin: float = 0.1     # two reported causes of one rank this close are a contest (eroica.engine.verdicts)
    contest_factor: float = 0.8     # what each keeps when no deciding evidence settles it


@lru_cache(maxsize=8)
def _taxonomy_doc(path: Path) -> dict[str, Any]:
    """A taxonomy file, parsed once per process (root causes, resolution and the coverage floor), by
    libyaml where PyYAML has it (the pure-Python parser is many times slower)."""
    return dict(yaml.load(path.read_text(), Loader=SAFE_LOADER))


def load_taxonomy(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None) -> dict[str, TaxonomyEntry]:
    """The shipped taxonomy, plus the root causes a site adds in `<site dir>/taxonomy.yaml` (new ids
    only: a shipped one is changed through the rules and overrides, not redefined); RuleError with
    every problem (file and line) when one is wrong."""
    out, problems = taxonomy_and_problems(knowledge_dir, site_dirs)
    if problems:
        raise RuleError(problems)
    return out


ENTRY_KEYS = tuple(TaxonomyEntry.__dataclass_fields__)
REQUIRED = ("category", "component", "question", "runbook")
CATEGORIES = ("hardware", "software")     # eroica.schema.diagnosis.FindingCategory: people, or the assistant


def taxonomy_and_problems(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None,
                          ) -> tuple[dict[str, TaxonomyEntry], list[str]]:
    """The taxonomy with every valid root cause, and the problems of the others (file and line each), so
    that one wrong site entry does not leave the rules that name shipped causes without their taxonomy."""
    shipped = (knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml"
    data = _taxonomy_doc(shipped)
    out = {k: TaxonomyEntry.parse(v, k) for k, v in data["root_causes"].items()}
    where: dict[str, str] = {k: str(shipped) for k in out}
    problems: list[str] = []
    for d in site_dirs or []:
        f = Path(d) / "taxonomy.yaml"
        if f.exists():
            problems += _site_file(f, data, out, where)
    for k, e in out.items():
        for field, xs in (("explained_by", e.explained_by), ("superseded_by", e.superseded_by)):
            problems += [f"{where[k]}: root cause {k!r}: {field} names {x!r}, which the taxonomy does not have; fix "
                         "the id or add the root cause" for x in xs if x != "*" and x not in out]
    problems += [f"{where[k]}: root cause {k!r}: {u}" for k, u in _unknown_evidence(out)]
    return out, problems


def _site_file(f: Path, shipped: dict[str, Any], out: dict[str, TaxonomyEntry], where: dict[str, str]) -> list[str]:
    """Add a site taxonomy file's new root causes to `out`; its problems, each with the file and line."""
    import difflib

    from eroica.engine.rules.source import line_map, line_of

    try:
        text = f.read_text()
        node, data = yaml.compose(text, Loader=SAFE_LOADER), yaml.load(text, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [f"{f}{f':{mark.line + 1}' if mark else ''}: not valid YAML: {getattr(exc, 'problem', exc)}"]
    lines = line_map(node) if node is not None else {}

    def at(*loc: Any) -> str:
        return f"{f}:{line_of(lines, loc)}"

    if not isinstance(data, dict):
        return [f"{f}:1: expected a mapping `root_causes: {{<id>: {{category, component, question, runbook}}}}`"]
    problems = [f"{at(k)}: {k!r}: a site's taxonomy adds root causes (`root_causes:`); "
                + (f"did you mean {near[0]}?" if (near := difflib.get_close_matches(str(k), ["root_causes"], 1, 0.6))
                   else "the resolution, hang and coverage floor are the shipped taxonomy's")
                for k, v in data.items() if k != "root_causes" and shipped.get(k) != v]
    site = data.get("root_causes") or {}
    if not isinstance(site, dict):
        return [*problems, f"{at('root_causes')}: root_causes maps each id to its category, component, question, "
                           "runbook"]
    for k, v in site.items():
        if k in out:
            if isinstance(v, dict) and _same(v, k, out[k]):
                continue                          # an identical copy (a site's copy of knowledge/): the same cause
            problems.append(f"{at('root_causes', k)}: root cause {k!r} is already in the taxonomy ({where[k]}); a "
                            "site adds new ids (a shipped cause is changed through rules and overrides)")
            continue
        if not isinstance(v, dict):
            problems.append(f"{at('root_causes', k)}: root cause {k!r}: expected a mapping of "
                            f"{', '.join(REQUIRED)}")
            continue
        bad = [f"{at('root_causes', k, key)}: root cause {k!r}: unknown key {key!r}"
               + (f"; did you mean {near[0]}?" if (near := difflib.get_close_matches(str(key), ENTRY_KEYS, 1, 0.6))
                  else f"; keys: {', '.join(ENTRY_KEYS)}") for key in v if key not in ENTRY_KEYS]
        bad += [f"{at('root_causes', k)}: root cause {k!r} needs `{key}:`" for key in REQUIRED if key not in v]
        if "category" in v and v["category"] not in CATEGORIES:
            bad.append(f"{at('root_causes', k, 'category')}: root cause {k!r}: category {v['category']!r} is "
                       f"{' or '.join(CATEGORIES)} (hardware goes to people, software to the assistant)")
        if bad:
            problems += bad
            continue
        try:
            entry = TaxonomyEntry.parse(v, k)
        except (TypeError, ValueError) as exc:
            problems.append(f"{at('root_causes', k)}: root cause {k!r}: {exc}")
            continue
        # a site's runbook is the site's file (or a URL): reports and tickets name where it is
        if "://" not in entry.runbook and not Path(entry.runbook).is_absolute():
            entry = replace(entry, runbook=str((f.parent / entry.runbook).resolve()))
        out[k], where[k] = entry, at("root_causes", k)
    return problems


def _same(v: dict[str, Any], k: str, entry: TaxonomyEntry) -> bool:
    try:
        return TaxonomyEntry.parse(v, k) == entry
    except (TypeError, ValueError):
        return False


def _unknown_evidence(entries: dict[str, TaxonomyEntry]) -> list[tuple[str, str]]:
    """Deciding evidence that names a fact kind the peer analysis does not produce (derived facts are
    the rules' own, not on the rank when findings are reconciled), or a field it lacks: (cause, why)."""
    import difflib

    kinds = {k: set(t.model_fields) for k, t in FACT_TYPES.items()}
    out = []
    for k, e in entries.items():
        for d in e.decided_by:
            if d.fact not in kinds:
                near = difflib.get_close_matches(d.fact, list(kinds), 1, 0.6)
                out.append((k, f"decided_by names fact {d.fact!r}" + (f"; did you mean {near[0]}?" if near else "")
                            + f"; the engine's facts are {', '.join(sorted(kinds))}"))
            elif set(d.where) - kinds[d.fact]:
                out.append((k, f"decided_by {d.fact} has no field(s) {', '.join(sorted(set(d.where) - kinds[d.fact]))}"
                               f"; its fields: {', '.join(sorted(kinds[d.fact]))}"))
    return out


@dataclass(frozen=True)
class CoverageFloor:
    min_ranks: int = 3
    min_ratio: float = 0.5

    def why_not(self, reported: int, world: int) -> str | None:
        """Why a window with `reported` of `world` ranks cannot be diagnosed (None: it can)."""
        if reported == 0:
            return "no rank's patterns could be read (see the file problems): nothing to compare"
        if world >= self.min_ranks and reported < self.min_ranks:
            return f"only {reported} of {world} ranks reported (the floor is {self.min_ranks})"
        if world and reported / world < self.min_ratio:
            return (f"only {reported} of {world} ranks reported ({reported / world:.0%}, the floor is "
                    f"{self.min_ratio:.0%}): what the others did is unknown")
        return None


@dataclass(frozen=True)
class HangResolution:
    """How a hang's conclusions become one verdict (knowledge/taxonomy.yaml `hang`)."""

    precedence: tuple[str, ...]
    fallback_cause: str
    fallback_confidence: float
    fallback_summary: str

    def rank(self, cause: str) -> int:
        """A cause's place: those of `precedence` first, in its order; any other (a site's) after."""
        return self.precedence.index(cause) if cause in self.precedence else len(self.precedence)


def load_hang_resolution(knowledge_dir: Path | None = None) -> HangResolution:
    path = (knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml"
    data = _taxonomy_doc(path).get("hang") or {}
    try:
        fb = data["fallback"]
        return HangResolution(precedence=tuple(data.get("precedence") or ()), fallback_cause=str(fb["root_cause"]),
                              fallback_confidence=float(fb["confidence"]),
                              fallback_summary=" ".join(str(fb["summary"]).split()))
    except (KeyError, TypeError, ValueError) as exc:
        raise RuleError([f"{path}: `hang` needs precedence and fallback: {{root_cause, confidence, summary}} "
                         f"({type(exc).__name__}: {exc})"]) from exc


def load_resolution(knowledge_dir: Path | None = None) -> Resolution:
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    return Resolution(**(data.get("resolution") or {}))


def load_coverage_floor(knowledge_dir: Path | None = None) -> CoverageFloor:
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    return CoverageFloor(**(data.get("coverage_floor") or {}))
