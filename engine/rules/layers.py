"""The one compile path: the knowledge every command runs on, built in layers.

    shipped (knowledge/)  ->  each site directory, in the order given  ->  --rules paths  ->  overrides
    (each site's overrides/*.yaml, then --overrides files)  ->  the rules under test (`rules test|lint PATH`)

A later layer's word wins: a site adds rules and root causes (its taxonomy.yaml) and hypotheses (its
hypotheses.yaml), replaces a shipped rule by writing one of the same id with `replaces: <why>`, and
tunes or disables one by id in overrides (`reason:` required). A copy identical to an earlier layer's
rule, root cause or hypothesis is the same thing, not a conflict (a site may keep a full copy of
knowledge/). Site directories come from `$EROICA_KNOWLEDGE` (os.pathsep-separated) first, then the
command line's `--knowledge`.

`eroica rules lint`, `rules test`, `rules list|show|coverage|new`, `rules promote`, `diagnose`, `eval`
and `serve` (windows and hangs) all build their knowledge through `load` (or `compiled`, its cached
rule IR): whatever the engine would refuse, lint refuses first, with file and line.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eroica.engine import rule_cache
from eroica.engine.errors import RuleError
from eroica.engine.rules.ir import RuleIR
from eroica.engine.rules.loader import rule_files
from eroica.engine.rules.source import LoadedRule, builtin_knowledge_dir, builtin_rules_dir

if TYPE_CHECKING:
    from eroica.engine.rules.overrides import Override
    from eroica.engine.rules.vocabulary import Vocabulary
    from eroica.engine.taxonomy import TaxonomyEntry

ENV = "EROICA_KNOWLEDGE"
SHIPPED = "shipped"


def env_dirs() -> tuple[Path, ...]:
    """The site directories `$EROICA_KNOWLEDGE` names (os.pathsep-separated), in order."""
    return tuple(Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip())


@dataclass(frozen=True)
class KnowledgeSpec:
    """What to build the knowledge from, beyond the shipped knowledge/."""

    site_dirs: tuple[Path, ...] = ()        # each: rules/, overrides/*.yaml, taxonomy.yaml, hypotheses.yaml
    rule_paths: tuple[Path, ...] = ()       # more rule files or directories (diagnose --rules)
    override_files: tuple[Path, ...] = ()   # more override files (diagnose --overrides), applied last
    targets: tuple[Path, ...] = ()          # the rules under test or lint, loaded last
    fitted_priors: bool = True              # knowledge/priors.yaml (False: the rules' hand-set confidences)

    @classmethod
    def of(cls, site_dirs: list[Path] | tuple[Path, ...] = (), env: bool = True, **kw: Any) -> KnowledgeSpec:
        """`$EROICA_KNOWLEDGE`'s directories (unless `env` is False), then `site_dirs`."""
        dirs = [*(env_dirs() if env else ()), *map(Path, site_dirs)]
        return cls(site_dirs=tuple(dict.fromkeys(dirs)), **kw)

    def site_problems(self) -> list[str]:
        from eroica.engine.rules import site_dirs

        env = set(env_dirs())
        return [p for d in self.site_dirs
                for p in site_dirs.problems(d, f"${ENV} {d}" if d in env else f"--knowledge {d}")]

    def override_paths(self) -> list[Path]:
        return [*(f for d in self.site_dirs for f in sorted((d / "overrides").glob("*.yaml"))), *self.override_files]

    def inputs(self) -> list[Path]:
        """Every file the compiled rules depend on (the rule cache's key)."""
        k = builtin_knowledge_dir()
        files = rule_files([builtin_rules_dir(), *(d / "rules" for d in self.site_dirs if (d / "rules").is_dir()),
                            *self.rule_paths, *self.targets])
        return [*files, *self.override_paths(), k / "priors.yaml", k / "taxonomy.yaml", k / "hypotheses.yaml",
                *(d / n for d in self.site_dirs for n in ("taxonomy.yaml", "hypotheses.yaml"))]


@dataclass(frozen=True)
class RuleEntry:
    """One rule of the knowledge as `eroica rules list` shows it: where it comes from, what changed it."""

    written: LoadedRule                  # as its file says
    effective: LoadedRule                # after its prior and overrides
    origin: str                          # "shipped", or the site directory / path it came from
    enabled: bool = True
    why_disabled: str = ""
    replaces: str = ""                   # the origin of the rule it replaces, with the reason
    override: str = ""                   # "file:line (reason)" of the override that changed it
    prior: str = "hand-set"              # where its prior comes from: hand-set, fitted, override
    retuned: bool = False                # an override moved its thresholds (its tests were written for the old)
    disabled_at: str = ""                # "file:line" of the override that disabled it

    @property
    def id(self) -> str:
        return self.written.rule.id


@dataclass(frozen=True)
class Knowledge:
    spec: KnowledgeSpec
    entries: tuple[RuleEntry, ...]
    rules: list[LoadedRule]              # the enabled rules, as the engine runs them
    irs: list[RuleIR]
    taxonomy: dict[str, TaxonomyEntry]
    vocabulary: Vocabulary
    problems: list[str] = field(default_factory=list)
    refused: frozenset[str] = frozenset()     # enabled rules the engine would refuse (their problems above)
    types: dict[str, Any] = field(default_factory=dict)   # every fact kind's model: measured, and hypotheses

    def notes(self) -> list[str]:
        """What the sites changed, in a line each, for a report's reader: a window read "healthy" may be
        one whose rule a site disabled."""
        out = []
        for origin in dict.fromkeys(e.origin for e in self.entries if e.origin != SHIPPED):
            mine = [e for e in self.entries if e.origin == origin]
            out.append(f"{origin}: {sum(not e.replaces for e in mine)} rule(s) added"
                       + (f", {sum(bool(e.replaces) for e in mine)} replacing shipped ones" if any(
                           e.replaces for e in mine) else ""))
        out += [f"{e.id} {e.why_disabled}" for e in self.entries if not e.enabled and e.disabled_at]
        out += [f"{e.id} overridden at {e.override}" for e in self.entries if e.enabled and e.override]
        return out

    def entry(self, rule_id: str) -> RuleEntry | None:
        return next((e for e in self.entries if e.id == rule_id), None)

    def targets(self) -> list[LoadedRule]:
        """The rules under test: those of the spec's targets (all enabled rules when it names none)."""
        if not self.spec.targets:
            return self.rules
        files: set[str] = set()
        for target in self.spec.targets:
            try:
                files |= {str(p.resolve()) for p in rule_files([target])}
            except RuleError:
                continue                     # a bad target is among the problems already
        return [lr for lr in self.rules if str(Path(lr.path).resolve()) in files]


def _origins(spec: KnowledgeSpec) -> list[tuple[str, list[Path], bool]]:
    """(origin, rule paths, whether it is the layer under test) for each layer, first to last."""
    out = [(SHIPPED, [builtin_rules_dir()], False)]
    out += [(str(d), [d / "rules"], False) for d in spec.site_dirs if (d / "rules").is_dir()]
    out += [(str(p), [p], False) for p in spec.rule_paths]
    if spec.targets:
        out.append(("under test", list(spec.targets), True))
    return out


def _gather(spec: KnowledgeSpec, problems: list[str]) -> dict[str, tuple[LoadedRule, str, str]]:
    """Every rule by id, later layers replacing earlier ones: id -> (rule, origin, what it replaces)."""
    from eroica.engine.rules.loader import parse_rule_file
    from eroica.engine.rules.site_dirs import looks_like_site

    by_id: dict[str, tuple[LoadedRule, str, str]] = {}
    seen_files: set[str] = set()
    for origin, paths, under_test in _origins(spec):
        given = under_test or origin in map(str, spec.rule_paths)      # paths a person typed, not a site's rules/
        sites = [p for p in paths if looks_like_site(Path(p))] if given else []
        if sites:
            problems += [f"{p}: a site knowledge directory (rules/, overrides/, taxonomy.yaml): pass it as "
                         f"--knowledge {p}; a PATH here is rule files or a folder of them" for p in sites]
            continue
        files = rule_files(paths, strict=given, problems=problems)
        mine: dict[str, str] = {}
        for f in files:
            key = str(f.resolve())
            if key in seen_files:
                continue                      # a file of an earlier layer named again (a shipped rule under test)
            seen_files.add(key)
            lr, probs = parse_rule_file(f)
            problems.extend(probs)
            if lr is None:
                continue
            rid, why = lr.rule.id, lr.rule.replaces
            if rid in mine:
                problems.append(f"{f}:1: rule id {rid!r} already used by {mine[rid]}; ids are never reused")
                continue
            mine[rid] = str(f)
            earlier = by_id.get(rid)
            if earlier is None:
                if why:
                    problems.append(f"{f}:{_line(lr, 'replaces')}: rule {rid!r} replaces nothing: no earlier layer "
                                    "has a rule of that id; drop `replaces` (a new rule) or fix the id")
                    continue
                by_id[rid] = (lr, origin, "")
            elif earlier[0].rule == lr.rule.model_copy(update={"replaces": None}):
                continue                      # an identical copy (a site's copy of knowledge/): the same rule
            elif why or under_test:
                by_id[rid] = (lr, origin, f"{earlier[1]} ({earlier[0].path})" + (f": {why}" if why else ""))
            else:
                problems.append(f"{f}:{_line(lr, 'id')}: rule id {rid!r} is already defined in {earlier[0].path} "
                                f"({earlier[1]}); to replace it at your site add `replaces: <why>` to this file, or "
                                "tune or disable it by id in overrides/<site>.yaml (with a `reason:`)")
    return by_id


def _line(lr: LoadedRule, key: str) -> int:
    from eroica.engine.rules.source import line_of

    return line_of(lr.lines, (key,))


def load(spec: KnowledgeSpec | None = None, raise_problems: bool = True) -> Knowledge:
    """The knowledge of `spec`, compiled and checked: every problem (parse, ids, overrides, compile,
    rules that can never fire, the taxonomy, hypotheses) with its file and line. Raises RuleError with
    all of them unless `raise_problems` is False (lint reports them with its own)."""
    from pydantic import ValidationError

    from eroica.engine.facts import FACT_TYPES
    from eroica.engine.hypotheses import load_hypotheses
    from eroica.engine.priors import load_priors
    from eroica.engine.rules.compiler import compile_each
    from eroica.engine.rules.overrides import apply, condition_index, load_override_files, validate
    from eroica.engine.rules.reach import producible, rule_problems
    from eroica.engine.rules.vocabulary import build
    from eroica.engine.taxonomy import taxonomy_and_problems

    spec = spec or KnowledgeSpec()
    problems = spec.site_problems()
    sites = [d for d in spec.site_dirs if d.is_dir()]
    taxonomy: dict[str, TaxonomyEntry] = {}
    hypotheses: dict[str, Any] = {}
    taxonomy, probs = taxonomy_and_problems(site_dirs=sites)
    problems += probs
    try:
        hypotheses = dict(load_hypotheses(site_dirs=sites))
    except RuleError as exc:
        problems.extend(exc.problems)
        hypotheses = dict(load_hypotheses())       # the shipped ones: a site's mistake is one problem, not many
    by_id = _gather(spec, problems)
    overrides: dict[str, Override] = {}
    try:
        overrides = load_override_files(spec.override_paths())
    except RuleError as exc:
        problems.extend(exc.problems)
    fields = {k: set(m.model_fields) for k, m in {**FACT_TYPES, **hypotheses}.items()}
    written = {k: v[0] for k, v in by_id.items()}
    for rid, given in list(overrides.items()):      # an override that is wrong is reported, never applied
        bad = validate({rid: given}, written, fields)
        problems += bad
        if bad:
            del overrides[rid]
    priors = load_priors(builtin_knowledge_dir()) if spec.fitted_priors else {}
    entries: list[RuleEntry] = []
    for rid, (lr, origin, replaces) in by_id.items():
        o = overrides.get(rid)
        prior = priors.get(rid) if origin == SHIPPED and not replaces else None
        try:
            eff, how = apply(lr, o, prior)
        except ValidationError as exc:
            problems.append(f"{o.at() if o else lr.path}: the rule it makes is not valid: {exc.errors()[0]['msg']}")
            eff, how = apply(lr, None, prior)
        off = ("status: deprecated" if lr.rule.status.value == "deprecated"
               else f"disabled at {o.where('disabled')} ({o.reason})" if o is not None and o.spec.get("disabled")
               else "")
        entries.append(RuleEntry(lr, eff, origin, not off, off, replaces,
                                 f"{o.where()} ({o.reason})" if o is not None else "", how,
                                 bool(o is not None and o.spec.get("where")),
                                 o.at("disabled") if o is not None and o.spec.get("disabled") else ""))
    enabled = [e.effective for e in entries if e.enabled]
    compiled, probs = compile_each(enabled, sites, fields)
    problems += probs
    irs = [ir for _, ir in compiled]
    vocab = build(irs, hypotheses, taxonomy)
    have = producible(irs, vocab)
    silenced = _silenced(entries, irs, have, fields, problems)
    refused = {lr.rule.id for lr in enabled} - {ir.id for ir in irs} | set(silenced)
    for lr, ir in compiled:
        ov = overrides.get(lr.rule.id)
        where = {(i, str(f)): ov.at("where", key, f) for key, fs in (ov.spec.get("where") or {}).items()
                 if (i := condition_index(lr, key)) is not None and isinstance(fs, dict) for f in fs
                 } if ov is not None and isinstance(ov.spec.get("where"), dict) else None
        mine = rule_problems(lr, ir, vocab, have | silenced.get(lr.rule.id, set()), where)
        refused |= {lr.rule.id} if mine else set()
        problems += mine
    problems = list(dict.fromkeys(problems))            # one mistake seen twice is said once
    if problems and raise_problems:
        raise RuleError(problems)
    return Knowledge(spec, tuple(entries), enabled, irs, taxonomy, vocab, problems, frozenset(refused),
                     {**FACT_TYPES, **hypotheses})


load_knowledge = load      # its name at the engine's door (eroica.engine)


def _silenced(entries: list[RuleEntry], irs: list[RuleIR], have: set[str], fields: dict[str, set[str]],
              problems: list[str]) -> dict[str, set[str]]:
    """The enabled rules that a disabled rule leaves without a hypothesis they consume (rule id -> the
    kinds), each disabling reported once, at the override that disabled it, naming every rule it
    silences. A rule silenced so is refused, and not again for each of its conditions."""
    from eroica.engine.rules.compiler import compile_each

    off = [e for e in entries if not e.enabled and e.disabled_at and e.written.rule.emit.derive]
    if not off:
        return {}
    derives = {ir.id: ir.derived_kind for ir in irs}
    off_irs = {lr.rule.id: ir for lr, ir in compile_each([e.effective for e in off], vocab=fields)[0]}
    by_kind: dict[str, list[str]] = {}
    for ir in [*irs, *off_irs.values()]:
        if ir.derived_kind:
            by_kind.setdefault(ir.derived_kind, []).append(ir.id)

    def blame(kind: str, seen: set[str]) -> set[str]:
        out: set[str] = set()
        for rid in by_kind.get(kind, []):
            if rid in seen:
                continue
            seen.add(rid)
            if rid in off_irs:
                out.add(rid)
            else:
                ir = next(x for x in irs if x.id == rid)
                out |= {b for p in ir.patterns if p.kind not in have for b in blame(p.kind, seen)}
        return out

    silenced: dict[str, set[str]] = {}
    by_off: dict[str, list[str]] = {}
    for ir in irs:
        missing = {p.kind for p in ir.patterns if p.kind not in have}
        culprits = {b for k in missing for b in blame(k, set())}
        if culprits:
            silenced[ir.id] = missing
            for b in culprits:
                by_off.setdefault(b, []).append(ir.id)
    for e in off:
        if e.id in by_off:
            quiet = sorted(by_off[e.id])
            problems.append(f"{e.disabled_at}: disabling {e.id!r} silences {len(quiet)} rule(s) that consume the "
                            f"{derives.get(e.id) or (e.written.rule.emit.derive or {}).get('kind')!r} it derives: "
                            f"{', '.join(quiet)}; disable those too (each with a reason), or keep {e.id!r} and "
                            "retune it (where:)")
    return silenced


def compiled(spec: KnowledgeSpec | None = None) -> list[RuleIR]:
    """The compiled rules of `spec`, from the rule cache when no input changed (a diagnosis then
    imports neither the compiler nor the rule schema); RuleError when the knowledge has problems."""
    return compiled_with_notes(spec)[0]


def compiled_with_notes(spec: KnowledgeSpec | None = None) -> tuple[list[RuleIR], list[str]]:
    """`compiled`, and what the sites changed in it (`Knowledge.notes`: a report says it)."""
    spec = spec or KnowledgeSpec()
    problems = spec.site_problems()
    if problems:
        raise RuleError(problems)
    key = rule_cache.cache_key(spec.inputs(), spec.fitted_priors)
    cached = rule_cache.get(key)
    if cached is not None:
        return cached
    k = load(spec)
    rule_cache.put(key, (k.irs, k.notes()))
    return k.irs, k.notes()


@functools.lru_cache(maxsize=8)
def compiled_once(spec: KnowledgeSpec) -> tuple[RuleIR, ...]:
    """`compiled`, once per process (a service's hang localization on every snapshot)."""
    return tuple(compiled(spec))
