"""`eroica diagnose RUN_DIR | TRACES...`: peer comparison + rules over the pattern files of a run, or
of profiler traces ingested on the way.

With traces, the ingestion workers are forked before the engine is imported, so the engine's
imports run while the traces are summarized (on a small trace, importing costs as much as
ingesting)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from eroica.cli import knowledge_args
from eroica.cli.fastpath import resume_collection, warm_engine
from eroica.engine import FORMATS

#: exit codes: 0 diagnosed (found or not), 2 bad input (nothing diagnosed), NOT_DIAGNOSABLE a window fell
#: below the coverage floor or a hung job has no snapshot yet (no verdict), NOTHING a run directory with
#: nothing in it yet; with --exit-code, FOUND when a cause was found (as `git diff --exit-code` says)
FOUND = 1
NOT_DIAGNOSABLE = 3
NOTHING = 4
#: what a run directory holds before its first window (eroica's own logs and control files)
RUN_DIR_ONLY = frozenset({"logs", "control.jsonl", "control.log.jsonl", "meta.json", ".spool"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("exit status: 0 diagnosed (whatever was found); 2 bad input, nothing diagnosed; 3 not diagnosable "
                "(too few ranks reported, or a hung job without a snapshot yet); 4 nothing to diagnose yet (a run "
                "directory with no window); with --exit-code, 1 when a cause was found")
    p.description = ("PATH: a run directory (its windows' pattern files, its hang snapshots), or PyTorch "
                     "profiler (Kineto) trace files or directories of them, one file per rank: those are ingested "
                     "first, on every core, into --patterns DIR or a temporary directory.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="a run directory, an incident, a window directory or pattern file; or trace files")
    p.add_argument("--patterns", type=Path, default=None,
                   help="traces only: keep their pattern files here (default: a temporary directory, removed after)")
    p.add_argument("--rank", action="append", default=[], metavar="FILE=N",
                   help="traces only: the rank of a file that has no distributedInfo and no rank in its name")
    p.add_argument("--window", default=None, help="only this window id (default: all)")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text for a terminal, md for a ticket, html a self-contained page, json for machines "
                        "(default: %(default)s)")
    p.add_argument("-o", "--output", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--rules", type=Path, action="append", default=None, metavar="PATH",
                   help="more rule files or directories, loaded after the --knowledge directories; repeatable")
    p.add_argument("--overrides", type=Path, action="append", default=None, metavar="FILE",
                   help="more override files (as a site's overrides/*.yaml), applied last; repeatable")
    knowledge_args.add(p)
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when a cause was found (a finding at confidence 0.5 or more, or a hang not resolved "
                        "or confident), for scripts; 0 when every window is healthy")
    p.add_argument("--facts", action="store_true",
                   help="print the typed facts the rules see (one JSON object per line), for rule authors")
    p.set_defaults(func=run)


def print_facts(run_dir: Path, window: str | None) -> int:
    """The facts the rules see (with the job's history and the suspects' evidence gaps), every window of
    the run analyzed so that a later one sees the earlier ones."""
    import json

    from eroica.engine import analyze_windows, load_run

    windows = load_run(run_dir)
    if window is not None and window not in {w.window_id for w in windows}:
        from eroica.engine import RunDirError

        raise RunDirError(f"no window named {window!r}", path=str(run_dir))
    analyses = analyze_windows(windows)
    for w in windows:
        if window is None or w.window_id == window:
            for f in analyses[w.window_id].facts:
                print(json.dumps({"window": w.window_id, **f.model_dump(mode="json")}))
    return 0


def run(args: argparse.Namespace) -> int:
    from eroica.schema.files import is_run_path

    if len(args.paths) == 1 and is_run_path(args.paths[0]):
        return _run(args, args.paths[0])
    from eroica.cli.ingest_cmd import rank_overrides, trace_files
    from eroica.collector.kineto import IngestJob, write_doc

    files = trace_files(args.paths)
    only = args.paths[0] if len(args.paths) == 1 else None
    if not files and only is not None and only.is_dir() and {p.name for p in only.iterdir()} <= RUN_DIR_ONLY:
        print(f"eroica diagnose: {only}: nothing to diagnose yet: no window and no hang snapshot (a job writes "
              "its first window when its detector fires, or when one is asked for: eroica control --window-now)",
              file=sys.stderr)
        return NOTHING
    if not files:
        print(f"eroica diagnose: {', '.join(map(str, args.paths))}: neither a run directory (w*/rank-*.json) nor "
              "profiler traces (*.json, *.json.gz)", file=sys.stderr)
        return 2
    try:
        ranks = rank_overrides(args.rank)
    except ValueError as exc:
        print(f"eroica diagnose: {exc}", file=sys.stderr)
        return 2
    tmp = None if args.patterns else tempfile.TemporaryDirectory(prefix="eroica-trace-")
    run_dir: Path = args.patterns or Path(tmp.name)  # type: ignore[union-attr]
    try:
        n = 0
        job = IngestJob(files, ranks)          # workers start now; the engine is imported meanwhile
        warm_engine(args.format)
        resume_collection()
        for f, docs in job.results():
            if not isinstance(docs, list):
                print(f"eroica diagnose: skipped {f}: {docs}", file=sys.stderr)
                continue
            for doc in docs:
                write_doc(run_dir, doc)
            n += 1
        if not n:
            return 2
        print(f"eroica diagnose: {n} trace file(s) ingested" + (f" into {args.patterns}" if args.patterns else ""),
              file=sys.stderr)
        return _run(args, run_dir)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _emit(args: argparse.Namespace, text: str) -> None:
    """The report to `-o FILE`, or to stdout."""
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)


def _run(args: argparse.Namespace, run_dir: Path) -> int:
    from eroica.engine import DiagnoseOptions, EngineError, RuleError, diagnose, render

    resume_collection()
    if args.facts:
        try:
            return print_facts(run_dir, args.window)
        except EngineError as exc:
            print(f"eroica diagnose: {exc}", file=sys.stderr)
            return 2
    spec = knowledge_args.spec(args, rule_paths=tuple(args.rules or ()), override_files=tuple(args.overrides or ()))
    try:
        # the report puts a hang first (the job may still wait, and someone can act); one diagnosis per
        # process: the rules run in it (no worker process to start)
        d = diagnose(run_dir, DiagnoseOptions(knowledge=spec, window=args.window, in_process=True,
                                              workers=os.cpu_count() or 1))
    except RuleError as exc:
        print("eroica diagnose: the knowledge has problems (`eroica rules lint` lists the same):\n"
              + "\n".join(exc.problems), file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"eroica diagnose: {exc}", file=sys.stderr)
        return 2
    if not d.windows and d.hang is None:
        from eroica.engine import waiting

        said = waiting(run_dir) if run_dir.is_dir() else None
        if said is None:
            print(f"eroica diagnose: {run_dir} has no window directories with rank-<R>.json files and no hang "
                  "snapshot (hang-s*/) or watchdog header (hang-native/)", file=sys.stderr)
            return 2
        # a hung job's directory before its first snapshot: what its watchdogs' headers say, no verdict yet
        _emit(args, f"{run_dir}: no window and no hang snapshot yet. {said}\n")
        return NOT_DIAGNOSABLE
    text = render(d, args.format)
    if d.hang is not None and args.format in ("text", "md") and run_dir.is_dir():
        from eroica.engine import liveness

        if (now := liveness(run_dir, d.hang)) is not None:     # the report is of the snapshots; this line of now
            text = text.rstrip("\n") + f"\n\n{now}\n"
    _emit(args, text)
    lost = [w for w in d.windows if not w.diagnosable]
    for w in lost:   # the report is written; the exit code says that no verdict could be reached, and why
        first = f"; first: {w.coverage.file_problems[0]}" if w.coverage.file_problems else ""
        print(f"eroica diagnose: not diagnosable: {w.window}: {w.not_diagnosable_reason}"
              + (f" ({len(w.coverage.file_problems)} file problem(s){first})" if first else ""), file=sys.stderr)
    if lost:
        return NOT_DIAGNOSABLE
    hung = d.hang is not None and (d.hang.state != "resolved" or d.hang.confidence >= 0.5)
    return FOUND if args.exit_code and (hung or any(not w.healthy for w in d.windows)) else 0
