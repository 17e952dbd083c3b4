"""`eroica diagnose RUN_DIR`: peer comparison + rules over the pattern files of a run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eroica.engine.diagnose import DiagnoseOptions, diagnose, version
from eroica.engine.diagnosis import Diagnosis
from eroica.engine.errors import EngineError, RuleError
from eroica.engine.hang import localize
from eroica.engine.render import FORMATS, render

NOT_DIAGNOSABLE = 3    # exit code: a window fell below the coverage floor (no verdict)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="diagnose the windows of a run directory")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--window", default=None, help="only this window id (default: all)")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("-o", "--output", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--rules", type=Path, action="append", default=None,
                   help="extra rule file or directory (a site's own rules); repeatable")
    p.add_argument("--overrides", type=Path, action="append", default=None,
                   help="site override file (knowledge/overrides/<site>.yaml); repeatable")
    p.add_argument("--knowledge", type=Path, action="append", default=None,
                   help="a site knowledge directory: its rules/ are added, its overrides/*.yaml applied and the root "
                        "causes of its taxonomy.yaml added; repeatable")
    p.add_argument("--facts", action="store_true",
                   help="print the typed facts the rules see (one JSON object per line), for rule authors")
    p.set_defaults(func=run)


def print_facts(run_dir: Path, window: str | None) -> int:
    import json

    from eroica.engine.load import load_run
    from eroica.engine.peer import analyze

    for w in load_run(run_dir, window):
        for f in analyze(w).facts:
            print(json.dumps({"window": w.window_id, **f.model_dump(mode="json")}))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.facts:
        try:
            return print_facts(args.run_dir, args.window)
        except EngineError as exc:
            print(f"eroica diagnose: {exc}", file=sys.stderr)
            return 2
    rules, overrides = list(args.rules or []), list(args.overrides or [])
    for k in args.knowledge or []:
        if not k.is_dir():
            print(f"eroica diagnose: --knowledge {k}: not a directory (expected rules/, overrides/ and/or "
                  "taxonomy.yaml)", file=sys.stderr)
            return 2
    hung = localize(args.run_dir) if args.run_dir.is_dir() else None
    try:
        if hung is not None and not any(args.run_dir.glob("w*/rank-*.json")):   # hung before any window
            d = Diagnosis(run_dir=str(args.run_dir), eroica_version=version(), rules_loaded=0, windows=[], hang=hung)
        else:                  # the report puts a hang first: the job may still wait, and someone can act
            d = diagnose(args.run_dir, DiagnoseOptions(extra_rule_dirs=rules, override_files=overrides,
                                                       window=args.window, knowledge_dirs=list(args.knowledge or [])))
    except RuleError as exc:
        print("eroica diagnose: the rule base has problems:\n" + "\n".join(exc.problems), file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"eroica diagnose: {exc}", file=sys.stderr)
        return 2
    if not d.windows and d.hang is None:
        print(f"eroica diagnose: {args.run_dir} has no window directories with rank-<R>.json files", file=sys.stderr)
        return 2
    text = render(d, args.format)
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    lost = [w.window for w in d.windows if not w.diagnosable]
    if lost:   # the report is written; the exit code says that no verdict could be reached
        print(f"eroica diagnose: not diagnosable: {', '.join(lost)} (too few ranks reported)", file=sys.stderr)
        return NOT_DIAGNOSABLE
    return 0
