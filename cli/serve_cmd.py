"""`eroica serve`: the online service on embedded defaults (SQLite under ~/.local/share/eroica, HTTP on
127.0.0.1:8080), or a fleet's (`--db postgresql://...`, several replicas on one database)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
                   / "eroica", help="where the SQLite database lives (default ~/.local/share/eroica)")
    p.add_argument("--db", help="a database URL instead: postgresql://user@host/db (a fleet) or sqlite:///PATH")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--watch", type=Path, action="append", default=[],
                   help="a run root to watch for RUN_DIR/<window>/rank-R.json and packed files; repeatable")
    p.add_argument("--token-file", type=Path, help="a file holding the bearer token writes (and with --read-token, "
                                                   "reads) must carry")
    p.add_argument("--read-token", action="store_true", help="reads need the token too")
    p.add_argument("--grace-seconds", type=float, default=30.0,
                   help="diagnose a window with missing ranks this long after its last document (default 30)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--knowledge", action="append", default=[], help="a site knowledge directory, as for diagnose")
    p.add_argument("--workers", type=int, default=1, help="diagnosis worker processes (default 1)")
    p.add_argument("--drain-min-jobs", type=int, default=3,
                   help="a host is on the drain list when confident hardware findings name it in this many jobs")
    p.add_argument("--job-silent-seconds", type=float, default=900.0,
                   help="a run that sent nothing this long ended (killed without closing): its alerts resolve "
                        "(default 900)")
    p.add_argument("--alerts", type=Path, help="an alert file (eroica.alerts/v1): Alertmanager, webhook and Slack "
                                              "routes by category; see eroica.service.alerts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from eroica.service.app import Settings, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.db:
        url = args.db
    else:
        args.data.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{args.data / 'eroica.db'}"
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"eroica serve: --token-file {args.token_file}: {exc.strerror}", file=sys.stderr)
            return 2
        if not token:
            print(f"eroica serve: --token-file {args.token_file} is empty", file=sys.stderr)
            return 2
    missing = [str(w) for w in args.watch if not w.is_dir()]
    if missing:
        print(f"eroica serve: --watch {', '.join(missing)}: not a directory", file=sys.stderr)
        return 2
    alerts = None
    if args.alerts is not None:
        from eroica.service.alerts import load_alerts

        try:
            alerts = load_alerts(args.alerts)
        except ValueError as exc:
            print(f"eroica serve: {exc}", file=sys.stderr)
            return 2
    if args.drain_min_jobs < 1:
        print(f"eroica serve: --drain-min-jobs must be at least 1, got {args.drain_min_jobs}", file=sys.stderr)
        return 2
    settings = Settings(db_url=url, alerts=alerts, drain_min_jobs=args.drain_min_jobs, token=token,
                        read_token=args.read_token, job_silent_seconds=args.job_silent_seconds,
                        max_body_bytes=args.max_body_bytes, grace_seconds=args.grace_seconds,
                        watch=list(args.watch), knowledge_dirs=list(args.knowledge), workers=args.workers)
    print(f"eroica serve: http://{args.host}:{args.port}/ ({url.split('@')[-1]})", flush=True)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0
