"""`eroica rules ...`: the rule base's own tools, as promtool's are for Prometheus rules: test, lint,
list, show, vocabulary, new (a rule scaffolded from a window), coverage (where each rule fires on
recorded incidents) and promote. Every one builds the knowledge through the one compile path
(eroica.engine.rules.layers): the shipped knowledge, then each --knowledge directory."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from eroica.cli import knowledge_args
from eroica.engine import Knowledge, KnowledgeSpec, RuleError
from eroica.engine import load_knowledge as load

FORMATS = ("text", "json")
SECTIONS = ("facts", "signals", "domains", "gap_sources", "root_causes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("The rule base: every subcommand loads the shipped knowledge, then each --knowledge "
                     "directory (and $EROICA_KNOWLEDGE's), as diagnose, eval and serve do.")
    rs = p.add_subparsers(dest="rules_cmd", required=True, metavar="{test,lint,list,show,vocabulary,new,coverage,"
                                                                  "promote}")
    t = rs.add_parser("test", help="run the rules' inline tests (each with the rules deriving what it consumes)")
    t.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                   help="rule files or directories to test (default: every loaded rule)")
    li = rs.add_parser("lint", help="refuse rules that cannot fire (unknown values, impossible thresholds, facts "
                                    "nothing states) and check tests, references and lifecycle; file:line each")
    li.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                    help="rule files or directories to lint (default: every loaded rule)")
    ls = rs.add_parser("list", help="every rule: id, status, root cause, origin, enabled, what changed it")
    sh = rs.add_parser("show", help="one rule: its file, prior and the factors its confidence goes through, "
                                    "its tests, the incidents that name it")
    sh.add_argument("rule_id", metavar="ID", help="the rule's id (`eroica rules list` lists them)")
    sh.add_argument("--incidents", type=Path, action="append", default=[], metavar="DIR",
                    help="incident libraries to look the rule up in (default: each site's DIR/incidents and "
                         "./incidents)")
    vo = rs.add_parser("vocabulary", help="the facts and their fields (type, unit, range, values), hardware "
                                          "signals, gap sources and root causes rules are written in")
    vo.add_argument("--section", choices=SECTIONS, action="append",
                    help="print only these sections (repeatable; default: all); the JSON's keys are the same")
    nw = rs.add_parser("new", help="scaffold a site rule from a window's real facts: its firing test is the "
                                   "window, its quiet tests sit at each threshold")
    nw.add_argument("--from", dest="source", type=Path, required=True, metavar="RUN/WINDOW",
                    help="a window directory (RUN/w0-s40) or a run directory (its last window)")
    nw.add_argument("--rank", type=int, required=True, help="the rank the rule is about")
    nw.add_argument("--cause", required=True, help="the root cause it names (a taxonomy id, the site's too)")
    nw.add_argument("--id", dest="rule_id", help="the new rule's id (default: site.<cause>-<the function it names>)")
    nw.add_argument("--owner", default="site-sre", help="its owner (default: site-sre)")
    nw.add_argument("--force", action="store_true", help="overwrite an existing file")
    cv = rs.add_parser("coverage", help="replay incidents: where each rule fires, where it decides the finding, "
                                        "which rules never fire")
    cv.add_argument("incidents", nargs="*", type=Path, metavar="DIR",
                    help="incident libraries or incidents (default: each site's DIR/incidents, ./incidents and its "
                         "heldout/)")
    pr = rs.add_parser("promote", help="experimental rules that diagnose enough incidents and never fired on a "
                                       "healthy run become stable (--dry-run lists them)")
    pr.add_argument("--incidents", type=Path, action="append", default=[], metavar="DIR",
                    help="incident libraries, repeatable (default: ./incidents and each site's DIR/incidents); "
                         "their healthy runs (expect: []) show that a rule stays quiet")
    pr.add_argument("--min-incidents", type=int, default=3, help="incidents a rule must diagnose (default: 3)")
    pr.add_argument("--dry-run", action="store_true", help="list the candidates, change nothing")
    for sp, func in ((t, cmd_test), (li, cmd_lint), (ls, cmd_list), (sh, cmd_show), (vo, cmd_vocabulary),
                     (nw, cmd_new), (cv, cmd_coverage), (pr, cmd_promote)):
        knowledge_args.add(sp)
        if sp in (ls, sh, vo, cv):
            sp.add_argument("--format", choices=FORMATS if sp is not vo else (*FORMATS, "md"), default="text",
                            help="text (default) or json" + (", or md (the docs' tables)" if sp is vo else ""))
        sp.set_defaults(func=func)


def knowledge(args: argparse.Namespace, **kw: object) -> Knowledge:
    """The knowledge the arguments name, problems kept (the caller prints them)."""
    return load(knowledge_args.spec(args, **kw), raise_problems=False)


def _print_problems(problems: list[str], err: bool = False) -> None:
    for p in problems:
        print(p, file=sys.stderr if err else sys.stdout)


def cmd_test(args: argparse.Namespace) -> int:
    from eroica.engine.rules import cases, expect_problems, given_facts, run_tests

    k = knowledge(args, targets=tuple(args.paths))
    _print_problems(k.problems)
    bad_tests = [p for lr in k.targets() if lr.rule.id not in k.refused
                 for p in given_facts(k, lr) + expect_problems(k, lr)]
    _print_problems(bad_tests)
    targets = k.targets()
    refused = [lr.rule.id for lr in targets if lr.rule.id in k.refused]
    outcomes = run_tests(cases(k, [lr for lr in targets if lr.rule.id not in k.refused]))
    failed = 0
    for o in outcomes:
        print(f"{'PASS' if o.passed else 'FAIL'}  {o.rule_id}: {o.name}")
        if not o.passed:
            failed += 1
            print(f"      {o.path}: {o.detail}")
            e = k.entry(o.rule_id)
            if e is not None and e.retuned:
                print(f"      (its thresholds are overridden: {e.override}; this test was written for the ones "
                      "it ships with)")
    for rid in refused:
        print(f"FAIL  {rid}: refused (its problems are above); its tests were not run")
    untested = [lr.rule.id for lr in targets if not lr.rule.tests and lr.rule.id not in k.refused]
    for rid in untested:
        print(f"FAIL  {rid}: has no tests")
    tail = (f"; {len(k.problems)} problem(s) above: the engine refuses this knowledge as it is" if k.problems else
            f"; {len(bad_tests)} test(s) above give facts that never happen or expect what no rule concludes"
            if bad_tests else "")
    print(f"{len(outcomes) - failed} passed, {failed + len(untested) + len(refused)} failed{tail}")
    return 1 if failed or untested or refused or k.problems or bad_tests else 0


def cmd_lint(args: argparse.Namespace) -> int:
    from eroica.engine.rules import lint

    problems = lint(knowledge(args, targets=tuple(args.paths)))
    _print_problems(problems)
    print(f"{len(problems)} problem(s)" + ("; the rule format and the vocabulary: docs/rule-authoring.md, "
                                          "`eroica rules vocabulary`" if problems else ""))
    return 1 if problems else 0


def _loaded(args: argparse.Namespace) -> Knowledge | None:
    """The knowledge for the read-only commands; its problems go to stderr (they still list what loaded)."""
    k = knowledge(args)
    if k.problems:
        _print_problems(k.problems, err=True)
        print(f"eroica rules {args.rules_cmd}: the knowledge has {len(k.problems)} problem(s), above; showing what "
              "loaded", file=sys.stderr)
    return k


def cmd_list(args: argparse.Namespace) -> int:
    from eroica.cli.rules_info import list_rules

    k = _loaded(args)
    assert k is not None
    sys.stdout.write(list_rules(k, args.format))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from eroica.cli.rules_info import show_rule

    k = _loaded(args)
    assert k is not None
    text = show_rule(k, args.rule_id, libraries(args.incidents, k), args.format)
    if text is None:
        import difflib

        near = difflib.get_close_matches(args.rule_id, [e.id for e in k.entries], n=3, cutoff=0.5)
        print(f"eroica rules show: no rule {args.rule_id!r}" + (f"; closest: {', '.join(near)}" if near else "")
              + "; every id: `eroica rules list`", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def cmd_vocabulary(args: argparse.Namespace) -> int:
    from eroica.cli.rules_info import vocabulary

    k = _loaded(args)
    assert k is not None
    sys.stdout.write(vocabulary(k.vocabulary, args.format, args.section))
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from eroica.engine.rules import ScaffoldError, scaffold

    if not args.knowledge:
        print("eroica rules new: --knowledge DIR is required: the site directory the rule is written to "
              "(DIR/rules/)", file=sys.stderr)
        return 2
    site = args.knowledge[-1]
    site.mkdir(parents=True, exist_ok=True)             # a new site directory starts with its first rule
    try:
        path, text = scaffold(args.source, args.rank, args.cause, knowledge_args.spec(args), site,
                              rule_id=args.rule_id, owner=args.owner)
    except (ScaffoldError, RuleError) as exc:
        print(f"eroica rules new: {exc}", file=sys.stderr)
        return 2
    if path.exists() and not args.force:
        print(f"eroica rules new: {path} exists; pass --force to overwrite it, or --id for another name",
              file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    try:                                   # what the new rule makes of its own window
        from eroica.engine import DiagnoseOptions, diagnose

        d = diagnose(args.source, DiagnoseOptions(knowledge=knowledge_args.spec(args), in_process=True))
        w = d.windows[-1] if not args.source.name.startswith("w") else next(
            (x for x in d.windows if x.window == args.source.name), d.windows[-1])
        rid = text.split("\nid: ", 1)[1].split("\n", 1)[0]
        print(f"on {w.window}, rank {args.rank}: the new rule {'fires' if rid in w.rules_fired else 'does NOT fire'}"
              + ("" if rid in w.rules_fired else " (another site rule may match first: `eroica rules coverage`)"))
        for f in [f for f in w.findings if args.rank in f.ranks][:2]:
            print(f"  [{f.confidence:.2f}] {f.root_cause}, decided by {f.confidence_factors.prior_rule_id} "
                  f"({f.confidence_factors.explain(f.confidence)})")
    except RuleError as exc:
        _print_problems(exc.problems)
    print(f"next: eroica rules test {path} --knowledge {site}\n      eroica rules lint {path} --knowledge {site}")
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    from eroica.cli.rules_info import coverage_text
    from eroica.engine import coverage

    k = knowledge(args)
    if k.problems:
        _print_problems(k.problems, err=True)
        print(f"eroica rules coverage: the knowledge has {len(k.problems)} problem(s); fix them first",
              file=sys.stderr)
        return 2
    dirs = libraries(list(args.incidents), k)
    missing = [d for d in args.incidents if not d.is_dir()]
    if missing or not dirs:
        print(f"eroica rules coverage: {', '.join(map(str, missing)) or 'no ./incidents'}: no such incident "
              "directory", file=sys.stderr)
        return 2
    from eroica.engine import incident_dirs

    if not incident_dirs(dirs):
        print(f"eroica rules coverage: no incident (a folder with expected.yaml) in {', '.join(map(str, dirs))}",
              file=sys.stderr)
        return 2
    try:
        cov = coverage(k, dirs, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    except RuleError as exc:
        _print_problems(exc.problems, err=True)
        return 2
    sys.stdout.write(coverage_text(cov, args.format))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from eroica.engine import DiagnoseOptions, find_incidents, load_expected, promotion_candidates

    k = knowledge(args)
    if k.problems:
        _print_problems(k.problems, err=True)
        return 2
    libs = libraries(args.incidents, k)
    missing = [d for d in args.incidents if not d.is_dir()]
    if missing or not libs:
        print(f"eroica rules promote: {', '.join(map(str, missing)) or 'no ./incidents'}: no incident library "
              "there (--incidents DIR)", file=sys.stderr)
        return 2
    from eroica.engine import incident_dirs

    libs = [lib / "incidents" if not find_incidents(lib) and (lib / "incidents").is_dir() else lib for lib in libs]
    quiet = [p for p in incident_dirs(libs) if not load_expected(p / "expected.yaml").expect]
    if not quiet:
        print(f"eroica rules promote: no healthy run (expect: []) in {', '.join(map(str, libs))}: nothing shows that "
              "a rule stays quiet; record one beside the incidents, or add the shipped library (--incidents "
              "incidents)", file=sys.stderr)
        return 1
    spec: KnowledgeSpec = k.spec
    cands = promotion_candidates(libs, k.rules, args.min_incidents, DiagnoseOptions(in_process=True, knowledge=spec))
    for c in cands:
        print(f"{'would promote' if args.dry_run else 'promoted'} {c.rule_id} to stable: diagnoses "
              f"{', '.join(c.incidents)}, no confident finding on a healthy run ({c.path})")
        if not args.dry_run:
            path = Path(c.path)
            path.write_text(re.sub(r"^status: experimental", "status: stable", path.read_text(), count=1, flags=re.M))
    print(f"{len(cands)} rule(s) {'ready' if args.dry_run else 'promoted'}; checked against {len(quiet)} healthy "
          f"run(s) of {', '.join(map(str, libs))}")
    return 0


def libraries(given: list[Path], k: Knowledge) -> list[Path]:
    """The incident libraries a command reads: those given, else each site's DIR/incidents and ./incidents."""
    if given:
        return list(given)
    dirs = [d / "incidents" for d in k.spec.site_dirs if (d / "incidents").is_dir()]
    return [*dirs, *([Path("incidents")] if Path("incidents").is_dir() else [])]
