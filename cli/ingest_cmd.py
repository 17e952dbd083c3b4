"""`eroica ingest kineto TRACE_FILES_OR_DIR -o RUN_DIR`: profiler traces into pattern files.
`eroica ingest spool RUN_DIR...`: send what a job's sink spooled (the service was unreachable) and
could not send before the job exited, in the order it was made, each item to its route."""

from __future__ import annotations

import argparse
from pathlib import Path

from eroica.cli.fastpath import resume_collection
from eroica.collector.kineto import IngestJob, write_doc

SUFFIXES = (".json", ".json.gz")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=["kineto", "spool"],
                   help="kineto: PyTorch profiler Chrome-trace JSON, one file per rank; spool: a run directory whose "
                        "sink spooled documents the service never got (RUN_DIR/.spool)")
    p.add_argument("paths", nargs="+", type=Path, help="trace files (.json or .json.gz) or directories of them; "
                                                      "for spool, run directories")
    p.add_argument("-o", "--output", type=Path, help="the run directory to write (kineto)")
    p.add_argument("--server", help="spool: the service's URL (default: $EROICA_SINK; never the URL a spool's "
                                    "meta.json names, which anyone who can write the run directory can write)")
    p.add_argument("--token-file", type=Path, help="spool: the service's token (default: $EROICA_SINK_TOKEN)")
    p.add_argument("--rank", action="append", default=[], metavar="FILE=N",
                   help="the rank of a file that has no distributedInfo and no rank in its name")
    p.add_argument("--world-size", type=int, help="the job's number of ranks, when the traces do not say it")
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
    if args.format == "spool":
        return run_spool(args)
    if args.output is None:
        print("eroica ingest kineto: -o/--output RUN_DIR is required")
        return 2
    resume_collection()
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


SPOOL_ITEM_MAX_BYTES = 64 << 20        # a spooled item once decompressed (the service's body limit is 8 MiB)


def run_spool(args: argparse.Namespace) -> int:
    """Replay every rank's spool under each run directory; 0 when all of it was taken."""
    import os

    from eroica.collector.sink import ENV, gunzip_at_most, post_item, read_meta, spooled_kind

    token = os.environ.get("EROICA_SINK_TOKEN")
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"eroica ingest spool: --token-file {args.token_file}: {exc.strerror}")
            return 2
    sent = refused = left = 0
    spools = [d for p in args.paths for d in sorted((p / ".spool").glob("*")) if d.is_dir()]
    if not spools:
        print(f"eroica ingest spool: nothing spooled under {', '.join(str(p / '.spool') for p in args.paths)}")
        return 0
    # where the token goes is the operator's to say (--server, or the sink's EROICA_SINK), never a meta.json
    # (anyone who can write the run directory can write one)
    url = args.server or os.environ.get(ENV)
    if not url:
        named = sorted({str((read_meta(s) or {}).get("url")) for s in spools} - {"None"})
        print("eroica ingest spool: give --server URL (or set EROICA_SINK): the service to send the spool to"
              + (f" (its meta.json names {', '.join(named)[:300]}; a meta.json is not trusted with the token)"
                 if named else ""))
        return 2
    for spool in spools:
        meta = read_meta(spool)
        if meta is None:
            print(f"{spool}: no meta.json naming its job (spooled by an older eroica?): kept")
            left += len(list(spool.glob("*.json.gz")))
            continue
        if meta.get("url") and str(meta["url"]).rstrip("/") != url.rstrip("/"):
            print(f"{spool}: spooled for {str(meta['url'])[:200]}, sent to {url} (--server)")
        items = sorted(f for f in spool.glob("*.json.gz") if spooled_kind(f) is not None)
        for i, f in enumerate(items, 1):
            kind = str(spooled_kind(f))
            try:
                body = gunzip_at_most(f.read_bytes(), SPOOL_ITEM_MAX_BYTES)
            except (OSError, ValueError) as exc:
                print(f"[{i}/{len(items)}] {f}: unreadable ({exc}); kept")
                left += 1
                continue
            why = post_item(url, meta["job_id"], meta.get("job_name"), token, kind, body, 3, 10.0)
            if why is not None and not why.startswith("refused"):
                print(f"[{i}/{len(items)}] {f.name}: not sent ({why}); it and the rest of {spool} kept")
                left += len(items) - i + 1
                break
            if why is None:
                sent += 1
            else:
                refused += 1
                print(f"[{i}/{len(items)}] {f.name}: {why}")
            f.unlink()
        print(f"{spool}: job {meta['job_id']}: {sent} sent, {refused} refused so far")
    print(f"{sent} sent, {refused} refused (dropped: the service said why), {left} left in the spool")
    return 0 if left == 0 else 1
