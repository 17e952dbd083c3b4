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
SITE_PARTS = ("rules", "overrides", "taxonomy.yaml", "hypotheses.yaml")
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
        out = []
        for d in self.site_dirs:
            if not d.is_dir():
                out.append(f"--knowledge {d}: not a directory (a site knowledge directory holds rules/, "
                           "overrides/*.yaml, taxonomy.yaml and/or hypotheses.yaml)")
            elif (d / "priors.yaml").is_file() and (d / "priors.yaml").read_bytes() != (
                    builtin_knowledge_dir() / "priors.yaml").read_bytes():
                out.append(f"--knowledge {d}: priors.yaml is not read from a site (priors are fitted on the shipped "
                           "rules); set a rule's prior at your site in overrides/*.yaml (`confidence:`, with a reason)")
            elif stray := sorted(f.name for f in d.glob("*.y*ml") if f.name not in (*SITE_PARTS, "priors.yaml")):
                out.append(f"--knowledge {d}: {', '.join(stray[:3])}{' ...' if len(stray) > 3 else ''} would never be "
                           "read: a site directory's rules go in DIR/rules/, its overrides in DIR/overrides/")
        return out

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
    override: str = ""                   # "file:line: reason" of the override that changed it
    prior: str = "hand-set"              # where its prior comes from: hand-set, fitted, override
    retuned: bool = False                # an override moved its thresholds (its tests were written for the old)

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

    by_id: dict[str, tuple[LoadedRule, str, str]] = {}
    seen_files: set[str] = set()
    for origin, paths, under_test in _origins(spec):
        try:
            files = rule_files(paths, strict=under_test or origin != SHIPPED)
        except RuleError as exc:
            problems.extend(exc.problems)
            continue
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
    from eroica.engine.facts import FACT_TYPES
    from eroica.engine.hypotheses import load_hypotheses
    from eroica.engine.priors import load_priors
    from eroica.engine.rules.compiler import compile_each
    from eroica.engine.rules.overrides import apply, load_override_files, validate
    from eroica.engine.rules.reach import producible, rule_problems
    from eroica.engine.rules.vocabulary import build
    from eroica.engine.taxonomy import load_taxonomy

    spec = spec or KnowledgeSpec()
    problems = spec.site_problems()
    sites = [d for d in spec.site_dirs if d.is_dir()]
    taxonomy: dict[str, TaxonomyEntry] = {}
    hypotheses: dict[str, Any] = {}
    try:
        taxonomy = load_taxonomy(site_dirs=sites)
    except RuleError as exc:
        problems.extend(exc.problems)
    try:
        hypotheses = dict(load_hypotheses(site_dirs=sites))
    except RuleError as exc:
        problems.extend(exc.problems)
    by_id = _gather(spec, problems)
    overrides: dict[str, Override] = {}
    try:
        overrides = load_override_files(spec.override_paths())
    except RuleError as exc:
        problems.extend(exc.problems)
    fields = {k: set(m.model_fields) for k, m in {**FACT_TYPES, **hypotheses}.items()}
    problems += validate(overrides, {k: v[0] for k, v in by_id.items()}, fields)
    priors = load_priors(builtin_knowledge_dir()) if spec.fitted_priors else {}
    entries: list[RuleEntry] = []
    for rid, (lr, origin, replaces) in by_id.items():
        o = overrides.get(rid)
        prior = priors.get(rid) if origin == SHIPPED and not replaces else None
        eff, how = apply(lr, o, prior)
        off = ("status: deprecated" if lr.rule.status.value == "deprecated"
               else f"disabled by {o.at('disabled')}: {o.reason}" if o is not None and o.spec.get("disabled") else "")
        entries.append(RuleEntry(lr, eff, origin, not off, off, replaces,
                                 f"{o.at()}: {o.reason}" if o is not None else "", how,
                                 bool(o is not None and o.spec.get("where"))))
    enabled = [e.effective for e in entries if e.enabled]
    compiled, probs = compile_each(enabled, sites)
    problems += probs
    irs = [ir for _, ir in compiled]
    vocab = build(irs, hypotheses, taxonomy)
    have = producible(irs, vocab)
    for lr, ir in compiled:
        o = overrides.get(lr.rule.id)
        where = {(i, str(f)): o.at("where", i, f) for i, fs in (o.spec.get("where") or {}).items()
                 if isinstance(i, int) and isinstance(fs, dict) for f in fs
                 } if o is not None and isinstance(o.spec.get("where"), dict) else None
        problems += rule_problems(lr, ir, vocab, have, where)
    if problems and raise_problems:
        raise RuleError(problems)
    return Knowledge(spec, tuple(entries), enabled, irs, taxonomy, vocab, problems)


def compiled(spec: KnowledgeSpec | None = None) -> list[RuleIR]:
    """The compiled rules of `spec`, from the rule cache when no input changed (a diagnosis then
    imports neither the compiler nor the rule schema); RuleError when the knowledge has problems."""
    spec = spec or KnowledgeSpec()
    problems = spec.site_problems()
    if problems:
        raise RuleError(problems)
    key = rule_cache.cache_key(spec.inputs(), spec.fitted_priors)
    cached = rule_cache.get(key)
    if cached is not None:
        return cached
    rules = load(spec).irs
    rule_cache.put(key, rules)
    return rules


@functools.lru_cache(maxsize=8)
def compiled_once(spec: KnowledgeSpec) -> tuple[RuleIR, ...]:
    """`compiled`, once per process (a service's hang localization on every snapshot)."""
    return tuple(compiled(spec))
