"""`eroica ingest kineto TRACE_FILES_OR_DIR -o RUN_DIR`: profiler traces into pattern files."""

from __future__ import annotations

import argparse
from pathlib import Path

from eroica.cli.main import settle
from eroica.collector.kineto import IngestJob, write_doc

SUFFIXES = (".json", ".json.gz")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=["kineto"], help="kineto: PyTorch profiler Chrome-trace JSON, one file per rank")
    p.add_argument("paths", nargs="+", type=Path, help="trace files (.json or .json.gz) or directories of them")
    p.add_argument("-o", "--output", type=Path, required=True, help="the run directory to write")
    p.add_argument("--rank", action="append", default=[], metavar="FILE=N",
                   help="the rank of a file that has no distributedInfo and no rank in its name")
    p.add_argument("--world-size", type=int, help="when the traces do not say it")
    p.set_defaults(func=run)


def trace_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))
        else:
            out.append(p)
    return out


def rank_overrides(items: list[str]) -> dict[str, int]:
    """`--rank FILE=N` values: file name -> rank; ValueError naming the first bad one."""
    ranks: dict[str, int] = {}
    for item in items:
        name, _, n = item.partition("=")
        if not n.isdigit():
            raise ValueError(f"--rank {item!r}: expected FILE=N")
        ranks[Path(name).name] = int(n)
    return ranks


def run(args: argparse.Namespace) -> int:
    settle()
    try:
        ranks = rank_overrides(args.rank)
    except ValueError as exc:
        print(f"eroica ingest: {exc}")
        return 2
    files = trace_files(args.paths)
    if not files:
        print(f"eroica ingest: no trace files (*.json, *.json.gz) in {', '.join(map(str, args.paths))}")
        return 2
    ok, failed, raw, written = 0, 0, 0, 0
    for i, (f, docs) in enumerate(IngestJob(files, ranks, args.world_size).results(), 1):
        if not isinstance(docs, list):
            failed += 1
            print(f"[{i}/{len(files)}] skipped: {docs}")
            continue
        ok += 1
        raw += f.stat().st_size
        for doc in docs:
            out = write_doc(args.output, doc)
            written += out.stat().st_size
            print(f"[{i}/{len(files)}] rank {doc.job.rank}: {len(doc.step_times.during_seconds)} step(s), "
                  f"{len(doc.functions)} functions -> {out} ({out.stat().st_size} B from {f.stat().st_size} B)")
    print(f"{ok} rank(s) ingested, {failed} skipped; patterns {written} B from {raw} B of traces; "
          f"next: eroica diagnose {args.output}")
    return 0 if ok and not failed else (1 if ok else 2)
