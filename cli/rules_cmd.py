"""`eroica rules test|lint`: the rule base's own test runner and linter (like `promtool test rules`)."""

from __future__ import annotations

import argparse
import operator
from pathlib import Path

from eroica.engine.errors import RuleError
from eroica.engine.rules.compiler import compile_each, compile_rule, fact_fields, trace_field, with_derivations
from eroica.engine.rules.ir import THRESHOLD_OPS
from eroica.engine.rules.lint_refs import boundary_problems, given_problems, reference_problems, summary_problems
from eroica.engine.rules.loader import load_overrides, load_rules, parse_rule_file, rule_files
from eroica.engine.rules.runner import RuleTestCase, run_tests
from eroica.engine.rules.source import LoadedRule, builtin_rules_dir, line_of
from eroica.engine.taxonomy import load_taxonomy

_CMP = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def add_arguments(p: argparse.ArgumentParser) -> None:
    rs = p.add_subparsers(dest="rules_cmd", required=True)
    t = rs.add_parser("test", help="run every rule's inline tests")
    t.add_argument("paths", nargs="*", type=Path, help="rule files or directories (default: shipped rules)")
    li = rs.add_parser("lint", help="check rules: schema, fact fields, given facts, taxonomy, ids, references, "
                                    "a quiet test at every threshold's boundary")
    li.add_argument("paths", nargs="*", type=Path)
    pr = rs.add_parser("promote", help="experimental rules that diagnose enough incidents and never fired on a "
                                       "healthy run become stable (--dry-run lists them)")
    pr.add_argument("--incidents", type=Path, default=Path("incidents"), help="the incident library")
    pr.add_argument("--min-incidents", type=int, default=3)
    pr.add_argument("--dry-run", action="store_true", help="list the candidates, change nothing")
    pr.set_defaults(func=cmd_promote)
    for sp, func in ((t, cmd_test), (li, cmd_lint)):
        sp.add_argument("--knowledge", type=Path, action="append", default=[],
                        help="a site knowledge directory, as eroica diagnose takes it: its rules/ are added, its "
                             "overrides/*.yaml applied and its taxonomy.yaml's root causes known; repeatable")
        sp.set_defaults(func=func)


def _site(args: argparse.Namespace) -> tuple[list[Path], dict[str, dict[str, object]]]:
    """The rule paths and overrides that the arguments and the site knowledge directories name."""
    paths = list(args.paths or [builtin_rules_dir()])
    files: list[Path] = []
    for k in args.knowledge:
        if not k.is_dir():
            raise RuleError([f"--knowledge {k}: not a directory (expected rules/, overrides/ and/or taxonomy.yaml)"])
        if (k / "rules").is_dir():
            paths.append(k / "rules")
        files.extend(sorted((k / "overrides").glob("*.yaml")))
    return paths, load_overrides(files)


def build_cases(rules: list[LoadedRule], site_dirs: list[Path] | None = None) -> tuple[list[RuleTestCase], list[str]]:
    """One case per inline test; a rule that consumes hypotheses runs with the rules that derive them, so
    its tests may give measured facts (the chain runs) or the hypotheses themselves."""
    compiled, problems = compile_each(rules, site_dirs)
    irs = [ir for _, ir in compiled]
    cases: list[RuleTestCase] = []
    for lr, ir in compiled:
        chain = with_derivations(ir, irs)
        for t in lr.rule.tests:
            cases.append(RuleTestCase(lr.rule.id, t.name, chain, tuple(t.given), tuple(t.expect), lr.path))
    return cases, problems


def cmd_test(args: argparse.Namespace) -> int:
    try:
        paths, overrides = _site(args)
        rules = load_rules(paths, overrides)
    except RuleError as exc:
        print("\n".join(exc.problems))
        return 1
    cases, problems = build_cases(rules, args.knowledge)
    if problems:
        print("\n".join(problems))
        return 1
    outcomes = run_tests(cases)
    failed = 0
    for o in outcomes:
        mark = "PASS" if o.passed else "FAIL"
        print(f"{mark}  {o.rule_id}: {o.name}")
        if not o.passed:
            failed += 1
            print(f"      {o.path}: {o.detail}")
    untested = [lr.rule.id for lr in rules if not lr.rule.tests]
    for rid in untested:
        print(f"FAIL  {rid}: has no tests")
    print(f"{len(outcomes) - failed} passed, {failed + len(untested)} failed")
    return 1 if failed or untested else 0


def lint(paths: list[Path], site_dirs: list[Path] | None = None) -> list[str]:
    problems: list[str] = []
    loaded: list[LoadedRule] = []
    seen: dict[str, str] = {}
    for f in rule_files(paths):
        lr, probs = parse_rule_file(f)
        problems.extend(probs)
        if lr is None:
            continue
        if lr.rule.id in seen:
            problems.append(
                f"{f}:{line_of(lr.lines, ('id',))}: duplicate rule id {lr.rule.id!r} (also in {seen[lr.rule.id]})"
            )
            continue
        seen[lr.rule.id] = str(f)
        loaded.append(lr)
    taxonomy = load_taxonomy(site_dirs=site_dirs)
    vocab = fact_fields(site_dirs)
    irs = [ir for _, ir in compile_each(loaded, site_dirs)[0]]

    def sources(kind: str, field: str) -> list[tuple[str, str]]:
        return trace_field(kind, field, irs)

    for lr in loaded:
        r = lr.rule
        _, probs = compile_rule(lr, vocab)
        problems.extend(probs)
        problems.extend(given_problems(lr, vocab, site_dirs) + summary_problems(lr, vocab) + reference_problems(lr))
        problems.extend(boundary_problems(lr, THRESHOLD_OPS, _CMP, sources))
        if r.taxonomy is not None and r.taxonomy not in taxonomy:
            problems.append(f"{lr.path}:{line_of(lr.lines, ('taxonomy',))}: rule {r.id!r}: unknown taxonomy id "
                            f"{r.taxonomy!r}; add it to knowledge/taxonomy.yaml or use one of "
                            f"{', '.join(sorted(taxonomy))}")
        if r.status.value == "stable" and not r.incidents:
            problems.append(f"{lr.path}:{line_of(lr.lines, ('status',))}: rule {r.id!r} is stable but names no "
                            "incident; add `incidents: [ID]` or set status: test")
        if not any(t.expect for t in r.tests) or not any(not t.expect for t in r.tests):
            problems.append(f"{lr.path}:{line_of(lr.lines, ('tests',))}: rule {r.id!r} needs at least one firing "
                            "test and one quiet test")
        for i, cond in enumerate(r.when):
            for field, spec in cond.where.items():
                if not isinstance(spec, dict):
                    continue
                for op, val in spec.items():
                    if op not in THRESHOLD_OPS or not isinstance(val, (int, float)):
                        continue
                    srcs = sources(cond.fact, field)
                    vals = [g[f] for t in r.tests for g in t.given for k, f in srcs
                            if g.get("kind") == k and isinstance(g.get(f), (int, float))]
                    hit = any(_CMP[op](v, val) for v in vals)
                    miss = any(not _CMP[op](v, val) for v in vals)
                    if not (hit and miss):
                        side = "passing" if not hit else "failing"
                        problems.append(
                            f"{lr.path}:{line_of(lr.lines, ('when', i, 'where', field))}: rule {r.id!r}: threshold "
                            f"{cond.fact}.{field} {op} {val} has no test on its {side} side; add a test whose "
                            f"given {cond.fact} has {field} on that side")
    return problems


def cmd_lint(args: argparse.Namespace) -> int:
    try:
        paths, overrides = _site(args)
        if overrides:
            load_rules(paths, overrides)  # overrides are validated against the rules they name
        problems = lint(paths, args.knowledge)
    except RuleError as exc:
        problems = exc.problems
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)" + ("; the rule format and the knowledge layout: knowledge/README.md, "
                                          "docs/rule-authoring.md" if problems else ""))
    return 1 if problems else 0


def cmd_promote(args: argparse.Namespace) -> int:
    import re

    from eroica.engine.diagnose import DiagnoseOptions
    from eroica.engine.evaluate import promotion_candidates

    if not args.incidents.is_dir():
        print(f"eroica rules promote: {args.incidents}: no incident library there")
        return 2
    cands = promotion_candidates(args.incidents, load_rules(), args.min_incidents, DiagnoseOptions(in_process=True))
    for c in cands:
        print(f"{'would promote' if args.dry_run else 'promoted'} {c.rule_id} to stable: diagnoses "
              f"{', '.join(c.incidents)}, no confident finding on a healthy run ({c.path})")
        if not args.dry_run:
            path = Path(c.path)
            path.write_text(re.sub(r"^status: experimental", "status: stable", path.read_text(), count=1, flags=re.M))
    print(f"{len(cands)} rule(s) {'ready' if args.dry_run else 'promoted'}")
    return 0
