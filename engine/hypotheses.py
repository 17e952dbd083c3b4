"""Hypotheses: intermediate facts that rules derive and other rules consume, declared as knowledge.

`knowledge/hypotheses.yaml` (and a site's `<dir>/hypotheses.yaml`, new kinds only) names each kind,
its typed fields and its evidence line. Each becomes a frozen pydantic model beside the facts of
`engine/facts.py`, so a derived fact is as typed as a measured one: rules are compiled against its
fields, rule tests' given facts are validated against it, and a finding reached through it shows
its evidence line.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import create_model

from eroica.engine.errors import RuleError
from eroica.engine.facts import FACT_TYPES, Fact
from eroica.engine.rules.source import builtin_knowledge_dir, load_data_file

SCHEMA = "eroica.hypotheses/v1"
_TYPES: dict[str, type] = {"float": float, "int": int, "bool": bool, "str": str}


class Hypothesis(Fact):
    """A derived fact: which rule derived it is known to the engine, its fields are declared data."""

    description: ClassVar[str] = ""
    evidence_template: ClassVar[str] = ""

    def evidence(self) -> str:
        try:
            return self.evidence_template.format(**self.model_dump())
        except (KeyError, ValueError, TypeError):
            return f"reasoning: {getattr(self, 'kind', 'hypothesis')} on rank {self.rank}"


def _model(kind: str, spec: dict[str, Any], where: str) -> type[Hypothesis]:
    fields: dict[str, Any] = {}
    for name, t in (spec.get("fields") or {}).items():
        optional = isinstance(t, str) and t.endswith("?")
        base = _TYPES.get(str(t).rstrip("?"))
        if base is None:
            raise RuleError([f"{where}: hypothesis {kind!r}, field {name!r}: unknown type {t!r}; use one of "
                             f"{', '.join(_TYPES)} (a trailing ? allows null)"])
        fields[name] = (base | None, None) if optional else (base, ...)
    fields["kind"] = (Literal[kind], kind)    # a literal built from data: its own kind, as the facts' are
    model: type[Hypothesis] = create_model(f"Hypothesis_{kind}", __base__=Hypothesis, **fields)
    model.description = " ".join(str(spec.get("description", "")).split())
    model.evidence_template = str(spec.get("evidence", ""))
    return model


def _version(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return 0, 0
    return st.st_mtime_ns, st.st_size


def _specs(path: Path) -> dict[str, dict[str, Any]]:
    """A hypotheses file's kinds, read again when the file changed (a long-lived service's site)."""
    return _specs_at(path, *_version(path))


@lru_cache(maxsize=16)
def _specs_at(path: Path, mtime_ns: int, size: int) -> dict[str, dict[str, Any]]:
    data = load_data_file(path, SCHEMA, "see knowledge/hypotheses.yaml for the format")
    specs = dict(data.get("hypotheses") or {})
    for kind, spec in specs.items():
        if not isinstance(spec, dict):
            raise RuleError([f"{path}: hypothesis {kind!r} must be a mapping with description, evidence, fields"])
        if not isinstance(spec.get("fields") or {}, dict):
            raise RuleError([f"{path}: hypothesis {kind!r}: `fields` maps each field to its type (float, int, bool, "
                             f"str; a trailing ? allows null), got {spec.get('fields')!r}"])
    return specs


def _model_of(path: Path, kind: str) -> type[Hypothesis]:
    """One kind's model, built once per version of its file (pydantic model building is not free: a
    diagnosis builds only the ones it derived)."""
    return _model_at(path, kind, *_version(path))


@lru_cache(maxsize=256)
def _model_at(path: Path, kind: str, mtime_ns: int, size: int) -> type[Hypothesis]:
    return _model(kind, _specs_at(path, mtime_ns, size)[kind], str(path))


def _files(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None) -> list[Path]:
    """The shipped hypotheses file, then each site's that exists."""
    site = [Path(d) / "hypotheses.yaml" for d in site_dirs or []]
    return [(knowledge_dir or builtin_knowledge_dir()) / "hypotheses.yaml", *(f for f in site if f.exists())]


def load_hypotheses(knowledge_dir: Path | None = None, site_dirs: list[Path] | None = None) -> dict[str, type[Fact]]:
    """Every hypothesis kind, shipped then site, as fact models (a site adds kinds, never redefines)."""
    shipped, *site = _files(knowledge_dir, site_dirs)
    out: dict[str, type[Fact]] = {kind: _model_of(shipped, kind) for kind in _specs(shipped)}
    where: dict[str, Path] = dict.fromkeys(out, shipped)
    problems = []
    for f in site:
        for kind, spec in _specs(f).items():
            if kind in where and _specs(where[kind])[kind] == spec:
                continue                          # an identical copy (a site's copy of knowledge/): the same kind
            if kind in out or kind in FACT_TYPES:
                problems.append(f"{f}: hypothesis {kind!r} already exists ({where.get(kind, 'a measured fact')}); "
                                "a site adds new kinds (rename it)")
                continue
            out[kind], where[kind] = _model_of(f, kind), f
    if problems:
        raise RuleError(problems)
    return out


def hypothesis_types(kinds: set[str], site_dirs: list[Path] | None = None) -> dict[str, type[Fact]]:
    """The models of these hypothesis kinds only, as `load_hypotheses` gives them (the shipped file
    first, then each site's); a kind no file declares is left out."""
    out: dict[str, type[Fact]] = {}
    for f in _files(site_dirs=site_dirs):
        out.update({k: _model_of(f, k) for k in kinds & (_specs(f).keys() - out.keys())})
    return out


def all_fact_types(site_dirs: list[Path] | None = None) -> dict[str, type[Fact]]:
    """Measured facts and hypotheses: the vocabulary rules are written in."""
    return {**FACT_TYPES, **load_hypotheses(site_dirs=site_dirs)}
