"""The vocabulary rules are written in, generated from the code that produces it: every fact kind
with its fields (type, unit, range, the closed set of values a field can take), every hypothesis the
loaded rules derive (its fields' ranges and values traced to the measured fields they are copied
from), every hardware signal (eroica.schema.signals: unit, the collector source, where it is read),
every source a collector gap can name, and every root cause of the taxonomy.

`eroica rules vocabulary` prints it; `eroica rules lint` and the compile path check every rule
against it (eroica.engine.rules.reach); docs/rule-authoring.md's tables are generated from it.
"""

from __future__ import annotations

import types
import typing
from dataclasses import asdict, dataclass
from typing import Any

import annotated_types as at

from eroica.engine.facts import FACT_TYPES, Fact
from eroica.engine.rules.ir import REF, RuleIR
from eroica.engine.signals import GPU_SIGNALS, HW_SIGNALS
from eroica.engine.taxonomy import TaxonomyEntry
from eroica.schema.patterns import Category, MetricName
from eroica.schema.signals import GAP_SOURCES, SIGNALS, Signal

#: a field name's ending -> its unit, longest first (units are in field names: docs/architecture.md)
UNITS = (
    ("bytes_per_second", "bytes/s"), ("seconds_per_step", "s/step"), ("_ratio_to_baseline", "x the baseline"),
    ("ratio_to_median", "x the peers' median"), ("_ratio_to_peers", "x the peers'"), ("per_second", "per s"),
    ("_step_ratio", "share of a step"), ("seconds", "s"), ("bytes", "bytes"), ("cores", "cores"),
    ("_total", "count"), ("ratio", "ratio"), ("robust_z", "robust sigmas"),
)
#: hw_signal's fields that carry the signal's own unit and range
SIGNAL_VALUED = ("value", "peer_median")


def domains() -> dict[str, tuple[str, ...]]:
    """The closed sets a fact field can take (`eroica.engine.facts.one_of`), from the code that makes them."""
    return {
        "category": tuple(c.value for c in Category),
        "signal": (*HW_SIGNALS, *GPU_SIGNALS),
        "metric": tuple(m.value for m in MetricName),
        "gap_source": tuple(GAP_SOURCES),
    }


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str                       # float, int, bool, str; a trailing ? allows null
    unit: str | None = None
    low: float | None = None        # the values it can take (None: unbounded)
    high: float | None = None
    domain: str | None = None       # the closed set its values come from (Vocabulary.domains)
    values: tuple[str, ...] = ()    # that set's values

    @property
    def numeric(self) -> bool:
        return self.type.rstrip("?") in ("float", "int")

    def range_text(self) -> str:
        if self.low is None and self.high is None:
            return ""
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"[{lo}, {hi}]"


@dataclass(frozen=True)
class KindSpec:
    kind: str
    hypothesis: bool
    context: str                    # window or hang: where the engine states it
    description: str
    fields: dict[str, FieldSpec]
    derived_by: tuple[str, ...] = ()   # the loaded rules that derive it (hypotheses)


@dataclass(frozen=True)
class Vocabulary:
    kinds: dict[str, KindSpec]
    domains: dict[str, tuple[str, ...]]
    signals: tuple[Signal, ...]
    gap_sources: dict[str, str]
    root_causes: dict[str, TaxonomyEntry]

    def field(self, kind: str, name: str) -> FieldSpec | None:
        k = self.kinds.get(kind)
        return None if k is None else k.fields.get(name)

    def signal(self, name: str) -> Signal | None:
        return next((s for s in self.signals if s.name == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "facts": {k: {"hypothesis": s.hypothesis, "context": s.context, "description": s.description,
                          "derived_by": list(s.derived_by),
                          "fields": {f.name: {"type": f.type, "unit": f.unit, "range": [f.low, f.high],
                                              "domain": f.domain} for f in s.fields.values()}}
                      for k, s in self.kinds.items()},
            "domains": {k: list(v) for k, v in self.domains.items()},
            "signals": [asdict(s) for s in self.signals],
            "gap_sources": dict(self.gap_sources),
            "root_causes": {k: {"category": e.category, "component": e.component, "question": e.question}
                            for k, e in self.root_causes.items()},
        }


def unit_of(name: str, kind: str = "") -> str | None:
    if kind == "hw_signal" and name in (*SIGNAL_VALUED, "delta"):
        return "the signal's (see hardware signals)"
    return next((u for end, u in UNITS if name.endswith(end)), None)


def _type_name(ann: Any) -> tuple[str, bool, tuple[str, ...]]:
    """(base type, nullable, literal values) of a field's annotation."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Annotated:        # NonNegativeInt and the like: the type they bound
        return _type_name(args[0])
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        base, _, lits = _type_name(inner[0]) if len(inner) == 1 else ("any", False, ())
        return base, True, lits
    if typing.get_origin(ann) is typing.Literal:
        return "str", False, tuple(str(a) for a in args)
    return getattr(ann, "__name__", str(ann)), False, ()


def _inner_metadata(ann: Any) -> list[Any]:
    """The bounds of an optional bounded type (`NonNegativeInt | None`): pydantic keeps them inside the union."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(ann) if typing.get_origin(a) is typing.Annotated
                for m in typing.get_args(a)[1:]]
    return []


def _bounds(metadata: list[Any]) -> tuple[float | None, float | None]:
    low = high = None
    for m in metadata:
        if isinstance(m, (at.Ge, at.Gt)):
            low = float(getattr(m, "ge", getattr(m, "gt", 0)))
        elif isinstance(m, (at.Le, at.Lt)):
            high = float(getattr(m, "le", getattr(m, "lt", 0)))
    return low, high


def measured_fields(model: type[Fact], sets: dict[str, tuple[str, ...]]) -> dict[str, FieldSpec]:
    out: dict[str, FieldSpec] = {}
    for name, f in model.model_fields.items():
        if name == "kind":
            continue
        base, nullable, lits = _type_name(f.annotation)
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        domain = str(extra["domain"]) if "domain" in extra else (name if lits else None)
        low, high = _bounds([*f.metadata, *_inner_metadata(f.annotation)])
        kind = str(model.model_fields["kind"].default)
        out[name] = FieldSpec(name, base + ("?" if nullable else ""), unit_of(name, kind), low, high, domain,
                              sets.get(domain, lits) if domain else ())
    return out


def _join(specs: list[FieldSpec | None], name: str, type_: str) -> FieldSpec:
    """A hypothesis field that several rules fill: the union of what each copies into it."""
    known = [s for s in specs if s is not None]
    if not known or len(known) < len(specs):
        return FieldSpec(name, type_, unit_of(name))
    lows, highs = [s.low for s in known], [s.high for s in known]
    low = None if any(x is None for x in lows) else min(x for x in lows if x is not None)
    high = None if any(x is None for x in highs) else max(x for x in highs if x is not None)
    doms = {s.domain for s in known}
    domain = doms.pop() if len(doms) == 1 else None
    values = tuple(dict.fromkeys(v for s in known for v in s.values)) if domain else ()
    return FieldSpec(name, type_, known[0].unit or unit_of(name), low, high, domain, values)


def _literal(name: str, type_: str, value: Any) -> FieldSpec:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return FieldSpec(name, type_, unit_of(name), float(value), float(value))
    if isinstance(value, str):
        return FieldSpec(name, type_, unit_of(name), domain=f"literal:{value}", values=(value,))
    return FieldSpec(name, type_, unit_of(name))


def build(rules: list[RuleIR], hypotheses: dict[str, type[Fact]],
          taxonomy: dict[str, TaxonomyEntry]) -> Vocabulary:
    """The vocabulary of a loaded knowledge: the measured facts, and the hypotheses as `rules` derive them."""
    sets = domains()
    kinds: dict[str, KindSpec] = {
        k: KindSpec(k, False, m.context, " ".join((m.__doc__ or "").split()), measured_fields(m, sets))
        for k, m in FACT_TYPES.items()
    }
    derivers: dict[str, list[RuleIR]] = {}
    for r in rules:
        if r.derived_kind:
            derivers.setdefault(r.derived_kind, []).append(r)
    building: set[str] = set()

    def hypothesis(kind: str) -> KindSpec | None:
        if kind in kinds:
            return kinds[kind]
        model = hypotheses.get(kind)
        if model is None or kind in building:
            return None
        building.add(kind)
        own = measured_fields(model, sets)
        fields: dict[str, FieldSpec] = {"rank": own["rank"]}
        contexts: set[str] = set()
        for name, spec in own.items():
            if name == "rank":
                continue
            found: list[FieldSpec | None] = []
            for r in derivers.get(kind, []):
                src = dict(r.derive or ()).get(name)
                m = REF.match(src) if isinstance(src, str) else None
                if m is None:
                    found.append(_literal(name, spec.type, src))
                    continue
                alias_kind = next((p.kind for p in r.patterns if p.alias == m.group(1)), None)
                up = hypothesis(alias_kind) if alias_kind else None
                found.append(up.fields.get(m.group(2)) if up else None)
            fields[name] = _join(found, name, spec.type) if found else spec
        for r in derivers.get(kind, []):
            contexts |= {ks.context for p in r.patterns if (ks := hypothesis(p.kind)) is not None}
        building.discard(kind)
        spec_ = KindSpec(kind, True, contexts.pop() if len(contexts) == 1 else "window", model.description
                         if hasattr(model, "description") else "", fields,
                         tuple(r.id for r in derivers.get(kind, [])))
        kinds[kind] = spec_
        return spec_

    for k in hypotheses:
        hypothesis(k)
    return Vocabulary(kinds=kinds, domains=sets, signals=SIGNALS, gap_sources=dict(GAP_SOURCES),
                      root_causes=dict(taxonomy))
