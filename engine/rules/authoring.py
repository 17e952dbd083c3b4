"""What a rule's author is held to beyond what the engine refuses (eroica.engine.rules.layers): tests on
both sides of every threshold and a quiet test at each boundary, given facts that exist, summary fields
that exist, references that resolve, a stable rule's incident; and the rule tests themselves, each run
with the rules that derive what the rule consumes (the shipped chain, whatever file is tested alone)."""

from __future__ import annotations

import difflib
import operator
from pathlib import Path

from eroica.engine.rules.compiler import trace_field, with_derivations
from eroica.engine.rules.ir import THRESHOLD_OPS
from eroica.engine.rules.layers import Knowledge, KnowledgeSpec, load
from eroica.engine.rules.lint_refs import boundary_problems, given_problems, reference_problems, summary_problems
from eroica.engine.rules.runner import RuleTestCase
from eroica.engine.rules.source import LoadedRule, line_of

CMP = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def cases(k: Knowledge, rules: list[LoadedRule] | None = None) -> list[RuleTestCase]:
    """One case per inline test of `rules` (default: the knowledge's targets); a rule that consumes
    hypotheses runs with every rule of the knowledge that derives them, so its tests may give measured
    facts (the chain runs) or the hypotheses themselves."""
    irs = {ir.id: ir for ir in k.irs}
    out: list[RuleTestCase] = []
    for lr in k.targets() if rules is None else rules:
        ir = irs.get(lr.rule.id)
        if ir is None:
            continue
        chain = with_derivations(ir, k.irs)
        out += [RuleTestCase(lr.rule.id, t.name, chain, tuple(t.given), tuple(t.expect), lr.path)
                for t in lr.rule.tests]
    return out


def authoring_problems(k: Knowledge, lr: LoadedRule) -> list[str]:
    """One rule's tests, given facts, summary, references and lifecycle. A rule whose thresholds a site
    override moved keeps the tests written for the thresholds it ships with: they are not held to the
    new ones (what its override may set is checked like any rule's: eroica.engine.rules.reach)."""
    r = lr.rule
    entry = k.entry(r.id)
    retuned = entry is not None and entry.retuned
    fields = {name: set(ks.fields) | {"kind"} for name, ks in k.vocabulary.kinds.items()}
    sites = [d for d in k.spec.site_dirs if d.is_dir()]

    def sources(kind: str, field: str) -> list[tuple[str, str]]:
        return trace_field(kind, field, k.irs)

    site = Path(entry.origin) if entry is not None and entry.origin in map(str, sites) else None
    problems = (given_problems(lr, fields, sites, k.vocabulary, k.types) + summary_problems(lr, fields)
                + reference_problems(lr, site_dir=site))
    if not retuned:
        problems += boundary_problems(lr, THRESHOLD_OPS, CMP, sources)
    problems += expect_problems(k, lr)
    if r.status.value == "stable" and not r.incidents:
        problems.append(f"{lr.path}:{line_of(lr.lines, ('status',))}: rule {r.id!r} is stable but names no "
                        "incident; add `incidents: [ID]` or set status: test")
    if not any(t.expect for t in r.tests) or not any(not t.expect for t in r.tests):
        problems.append(f"{lr.path}:{line_of(lr.lines, ('tests',))}: rule {r.id!r} needs at least one firing "
                        "test and one quiet test")
    for i, cond in enumerate(r.when if not retuned else []):
        for field, spec in cond.where.items():
            if not isinstance(spec, dict):
                continue
            for op, val in spec.items():
                if op not in THRESHOLD_OPS or not isinstance(val, (int, float)):
                    continue
                srcs = sources(cond.fact, field)
                vals = [g[f] for t in r.tests for g in t.given for kd, f in srcs
                        if g.get("kind") == kd and isinstance(g.get(f), (int, float))]
                hit = any(CMP[op](v, val) for v in vals)
                miss = any(not CMP[op](v, val) for v in vals)
                if not (hit and miss):
                    side = "passing" if not hit else "failing"
                    problems.append(
                        f"{lr.path}:{line_of(lr.lines, ('when', i, 'where', field))}: rule {r.id!r}: threshold "
                        f"{cond.fact}.{field} {op} {val} has no test on its {side} side; add a test whose "
                        f"given {cond.fact} has {field} on that side")
    return problems


def expect_problems(k: Knowledge, lr: LoadedRule) -> list[str]:
    """An expectation that names a key no conclusion has (`root_cuase`) can never be met."""
    from eroica.engine.rules.conclusion import Conclusion

    r = lr.rule
    kind = (r.emit.derive or {}).get("kind")
    allowed = set(Conclusion.model_fields) if kind is None else {
        "kind", "rule_id", *(k.vocabulary.kinds[kind].fields if kind in k.vocabulary.kinds else ())}
    out = []
    for ti, t in enumerate(r.tests):
        for ei, e in enumerate(t.expect):
            for key in e:
                if key not in allowed:
                    near = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
                    out.append(f"{lr.path}:{line_of(lr.lines, ('tests', ti, 'expect', ei))}: rule {r.id!r} test "
                               f"{t.name!r}: expects {key!r}, which no conclusion has"
                               + (f"; did you mean {near[0]}?" if near else f"; keys: {', '.join(sorted(allowed))}"))
    return out


def given_facts(k: Knowledge, lr: LoadedRule) -> list[str]:
    """The facts its tests are given, against the vocabulary: `rules test` says these too (a test of a
    fact that never happens proves nothing)."""
    fields = {name: set(ks.fields) | {"kind"} for name, ks in k.vocabulary.kinds.items()}
    return given_problems(lr, fields, [d for d in k.spec.site_dirs if d.is_dir()], k.vocabulary, k.types)


def lint(k: Knowledge) -> list[str]:
    """Every problem of the knowledge (what the engine would refuse), then the authoring checks of its
    targets (each shipped and site rule when no target is named)."""
    problems = list(k.problems) + runbook_problems(k)
    for lr in k.targets():
        if lr.rule.id not in k.refused:           # a refused rule's tests wait until it can load
            problems += authoring_problems(k, lr)
    return problems


def runbook_problems(k: Knowledge) -> list[str]:
    """A site's root cause whose runbook is not there: the report and the ticket would point nowhere."""
    import yaml

    from eroica.engine.rules.source import SAFE_LOADER

    out = []
    for d in (d for d in k.spec.site_dirs if (d / "taxonomy.yaml").is_file()):
        try:
            causes = (yaml.load((d / "taxonomy.yaml").read_text(), Loader=SAFE_LOADER) or {}).get("root_causes") or {}
        except yaml.YAMLError:
            continue                              # among the knowledge's problems already
        for cause in causes:
            rb = k.taxonomy[cause].runbook if cause in k.taxonomy else ""
            if rb and "://" not in rb and not Path(rb).exists() and Path(rb).is_absolute():
                out.append(f"{d / 'taxonomy.yaml'}: root cause {cause!r}: its runbook {rb} does not exist; write it "
                           "(a Markdown page in the site directory) or give a URL")
    return out


def lint_paths(paths: list[Path], site_dirs: list[Path] | None = None) -> list[str]:
    """`eroica rules lint PATHS --knowledge DIR...`: the rules under `paths`, with the shipped knowledge
    and the sites loaded."""
    from eroica.engine.errors import RuleError

    try:
        k = load(KnowledgeSpec.of(site_dirs or [], env=False, targets=tuple(paths)), raise_problems=False)
    except RuleError as exc:
        return list(exc.problems)
    return lint(k)
