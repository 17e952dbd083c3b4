"""The taxonomy as the engine reads it: root causes, how findings on one rank are reconciled
(`resolution`, `superseded_by`, `explained_by`, `generic`), and the coverage floor.

All of it is data in `knowledge/taxonomy.yaml` (a site adds root causes in its own); nothing here
names a root cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from eroica.engine.errors import RuleError
from eroica.engine.rules.loader import SAFE_LOADER, builtin_knowledge_dir


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

    @classmethod
    def parse(cls, v: dict[str, Any]) -> TaxonomyEntry:
        return cls(**{**v, "explained_by": tuple(v.get("explained_by", ())),
                      "superseded_by": tuple(v.get("superseded_by", ()))})


@dataclass(frozen=True)
class Resolution:
    """How findings on the same rank are reconciled (knowledge/taxonomy.yaml `resolution`)."""

    explained_away_factor: float = 0.5
    unhealthy_at: float = 0.5


@lru_cache(maxsize=8)
def _taxonomy_doc(path: Path) -> dict[str, Any]:
    """A taxonomy file, parsed once per process (root causes, resolution and the coverage floor), by
    libyaml where PyYAML has it (the pure-Python parser took 50 ms of a small `eroica diagnose`)."""
    return dict(yaml.load(path.read_text(), Loader=SAFE_LOADER))


def load_taxonomy(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None) -> dict[str, TaxonomyEntry]:
    """The shipped taxonomy, plus the root causes a site adds in `<site dir>/taxonomy.yaml` (new ids
    only: a shipped one is changed through the rules and overrides, not redefined)."""
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    out = {k: TaxonomyEntry.parse(v) for k, v in data["root_causes"].items()}
    for d in site_dirs or []:
        f = Path(d) / "taxonomy.yaml"
        if not f.exists():
            continue
        try:
            site = (yaml.load(f.read_text(), Loader=SAFE_LOADER) or {}).get("root_causes") or {}
        except yaml.YAMLError as exc:
            raise RuleError([f"{f}: not valid YAML: {exc}"]) from exc
        problems = []
        for k, v in site.items():
            if k in out:
                problems.append(f"{f}: root cause {k!r} is already in the taxonomy; a site adds new ids")
                continue
            try:
                out[k] = TaxonomyEntry.parse(v)
            except TypeError as exc:
                problems.append(f"{f}: root cause {k!r}: {exc}; it needs category, component, question, runbook")
        if problems:
            raise RuleError(problems)
    dangling = [f"root cause {k!r}: {field} names {x!r}, which the taxonomy does not have"
                for k, e in out.items() for field, xs in (("explained_by", e.explained_by),
                                                          ("superseded_by", e.superseded_by))
                for x in xs if x != "*" and x not in out]
    if dangling:
        raise RuleError([f"taxonomy: {d}; fix the id or add the root cause" for d in dangling])
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


def load_resolution(knowledge_dir: Path | None = None) -> Resolution:
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    return Resolution(**(data.get("resolution") or {}))


def load_coverage_floor(knowledge_dir: Path | None = None) -> CoverageFloor:
    data = _taxonomy_doc((knowledge_dir or builtin_knowledge_dir()) / "taxonomy.yaml")
    return CoverageFloor(**(data.get("coverage_floor") or {}))
