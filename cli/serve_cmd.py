"""`eroica serve`: the online service on embedded defaults (SQLite under ~/.local/share/eroica, HTTP on
127.0.0.1:8080), or a fleet's (`--db postgresql://...`, several replicas on one database)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from eroica.cli import knowledge_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
                   / "eroica",
                   help="where the SQLite database lives (default $XDG_DATA_HOME/eroica, else ~/.local/share/eroica)")
    p.add_argument("--db", help="a database URL instead: postgresql://user@host/db (a fleet) or sqlite:///PATH")
    p.add_argument("--migrate", action="store_true",
                   help="bring the database's schema to this version's and exit (an upgrade's first step, a "
                        "Kubernetes init container; replicas also do it at start, one at a time)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1; beyond this machine needs --token-file)")
    p.add_argument("--port", type=int, default=8080, help="the TCP port to listen on (default 8080)")
    p.add_argument("--watch", action="append", default=[], metavar="ROOT[=GLOB]",
                   help="a run root to watch for RUN_DIR/<window>/rank-R.json, packed files and sink spools; "
                        "repeatable. Its files are untrusted input: only regular files inside it, within "
                        "--max-body-bytes; ROOT=GLOB lets it write only jobs whose id and name match GLOB (as a "
                        "job token), and never a job a writer of another scope created (a team's root given its "
                        "token's glob replays that team's spools)")
    p.add_argument("--watch-reconcile-seconds", type=float, default=300.0,
                   help="with --watch: new files are seen at once (inotify); the whole roots are scanned this "
                        "often too, for what inotify missed (default 300)")
    p.add_argument("--token-file", type=Path, help="a file holding the bearer token writes (and with --read-token, "
                                                   "reads) must carry")
    p.add_argument("--read-token", action="store_true", help="reads need the token too (people sign in at /login)")
    p.add_argument("--job-token-file", type=Path,
                   help="per-job tokens: one `JOB_NAME_GLOB TOKEN` per line; such a token may only send the "
                        "documents of jobs whose id and name match its glob, and read only those jobs")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients use to reach the service beyond this machine's own names and "
                        "addresses (a load balancer's, a DNS alias); repeatable; '*' allows any (not advised: "
                        "DNS rebinding)")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy (an address or a network, e.g. 10.0.0.0/24) whose X-Forwarded-Proto and "
                        "X-Forwarded-For are believed: behind one that terminates TLS the session cookie is Secure; "
                        "repeatable (default: the loopback addresses; others' forwarded headers are ignored)")
    p.add_argument("--insecure-no-token", action="store_true",
                   help="listen beyond this machine without a token (anyone who can reach it can write)")
    p.add_argument("--diagnosis-timeout-seconds", type=float, default=300.0,
                   help="end a window's diagnosis (and its worker) after this long and try it again (default 300)")
    p.add_argument("--grace-seconds", type=float, default=30.0,
                   help="diagnose a window with missing ranks this long after its last document (default 30)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="the largest request body or watched file, before and after decompression (default 8 MiB)")
    knowledge_args.add(p)
    p.add_argument("--workers", type=int, default=1, help="diagnosis worker processes (default 1)")
    p.add_argument("--parse-processes", type=int, default=0,
                   help="processes that parse a wide window's documents for its diagnosis (default 0: the "
                        "cores, up to 8)")
    p.add_argument("--http-processes", type=int, default=1,
                   help="processes answering uploads and pages on the one port (default 1; one takes ~200 host "
                        "uploads/s: give a fleet's replica one per core it may use)")
    p.add_argument("--drain-min-jobs", type=int, default=3,
                   help="a host is on the drain list when confident hardware findings name it in this many jobs "
                        "(default 3)")
    p.add_argument("--job-silent-seconds", type=float, default=900.0,
                   help="a run that sent nothing this long ended (killed without closing): its alerts resolve "
                        "(default 900)")
    p.add_argument("--alerts", type=Path, help="an alert file (eroica.alerts/v1): Alertmanager, webhook and Slack "
                                              "routes by category; see eroica.service.alerts")
    p.add_argument("--hang-alert-on", choices=("confirmed", "suspected"), default="confirmed",
                   help="a hung job's issue, and its alert, opens when the hang is confirmed (at the policy's limit, "
                   "300 s by default) or already when it is suspected (20 s without a step, 5 s when the peers wait "
                   "in a collective the rank never entered, at >= 0.5 confidence: the stall well past the job's own "
                   "longest pause; a job's first long checkpoint can be one, and its issue closes when the job "
                   "steps again). Default: %(default)s")
    p.set_defaults(func=run)


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind_names(host: str) -> list[str]:
    """The address it listens on is a name clients may use (not the wildcard addresses)."""
    return [] if host in ("0.0.0.0", "::", "") else [host.strip("[]")]


SWITCH_INTERVAL_SECONDS = 0.0005
MIN_TOKEN_CHARS = 16


def run(args: argparse.Namespace) -> int:
    from eroica.service.processes import shared_metrics

    if args.http_processes < 1:
        print(f"eroica serve: --http-processes must be at least 1, got {args.http_processes}", file=sys.stderr)
        return 2
    with shared_metrics(args.http_processes):      # before the service's modules import prometheus_client
        return _run(args)


def _serve_one(settings: Any, sock: socket.socket) -> None:
    import uvicorn

    from eroica.engine import freeze_startup
    from eroica.service.app import create_app

    app = create_app(settings)
    freeze_startup()
    uvicorn.Server(uvicorn.Config(app, log_level="warning", proxy_headers=True,
                                  forwarded_allow_ips=list(settings.trusted_proxies))).run(sockets=[sock])


def _migrate(url: str) -> int:
    import sqlalchemy as sa

    from eroica.service.db import make_engine, migrate, revision

    eng = make_engine(url)
    try:
        before = migrate(eng)
        after = revision(eng)
    except sa.exc.SQLAlchemyError as exc:
        print(f"eroica serve --migrate: {url.split('@')[-1]}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}",
              file=sys.stderr)
        return 1
    finally:
        eng.dispose()
    print(f"eroica serve --migrate: {url.split('@')[-1]}: schema {before or 'empty'} -> {after}"
          + (" (already current)" if before == after else ""), flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    from eroica.service.app import Settings
    from eroica.service.processes import listening_socket, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)     # its plugin list, at every start
    if args.db:
        url = args.db
    else:
        args.data.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{args.data / 'eroica.db'}"
    if args.migrate:
        logging.getLogger("alembic").setLevel(logging.WARNING)     # its own line says what changed
        return _migrate(url)
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
        if len(token) < MIN_TOKEN_CHARS:
            print(f"eroica serve: warning: the token in {args.token_file} has {len(token)} characters; anyone who "
                  f"guesses it can write. Use {MIN_TOKEN_CHARS} or more (python3 -c 'import secrets; "
                  "print(secrets.token_urlsafe(32))')", file=sys.stderr)
    if args.read_token and token is None:
        print("eroica serve: --read-token needs --token-file (without a token, reads would be silently open)",
              file=sys.stderr)
        return 2
    if token is None and not _loopback(args.host) and not args.insecure_no_token:
        print(f"eroica serve: --host {args.host} listens beyond this machine, and there is no --token-file: anyone "
              "who can reach it could write. Give --token-file, or --insecure-no-token to run it open on purpose.",
              file=sys.stderr)
        return 2
    job_tokens: dict[str, str] = {}
    if args.job_token_file is not None:
        from eroica.service.guard import load_job_tokens

        try:
            job_tokens = load_job_tokens(args.job_token_file)
        except ValueError as exc:
            print(f"eroica serve: --job-token-file {exc}", file=sys.stderr)
            return 2
        if token is None:
            print("eroica serve: --job-token-file needs --token-file (the service's own token)", file=sys.stderr)
            return 2
    from eroica.service.watch import parse_root

    try:
        scopes = [parse_root(w) for w in args.watch]
    except ValueError as exc:
        print(f"eroica serve: {exc}", file=sys.stderr)
        return 2
    missing = [str(w) for w, (root, _) in zip(args.watch, scopes) if not root.is_dir()]
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
    # the knowledge every window and hang is diagnosed with: refused now, with file and line, rather than
    # at the first window (the same compile path as `eroica rules lint`)
    from eroica.engine import RuleError, compiled

    spec = knowledge_args.spec(args)
    try:
        compiled(spec)
    except RuleError as exc:
        print("eroica serve: the knowledge has problems (`eroica rules lint` lists the same):\n"
              + "\n".join(exc.problems), file=sys.stderr)
        return 2
    import ipaddress

    for addr in args.trusted_proxy:
        try:
            ipaddress.ip_network(addr, strict=False)
        except ValueError:
            print(f"eroica serve: --trusted-proxy {addr!r} is not an address or a network (10.0.0.5, 10.0.0.0/24)",
                  file=sys.stderr)
            return 2
    if args.drain_min_jobs < 1:
        print(f"eroica serve: --drain-min-jobs must be at least 1, got {args.drain_min_jobs}", file=sys.stderr)
        return 2
    settings = Settings(db_url=url, alerts=alerts, drain_min_jobs=args.drain_min_jobs, token=token,
                        read_token=args.read_token, job_silent_seconds=args.job_silent_seconds,
                        max_body_bytes=args.max_body_bytes, grace_seconds=args.grace_seconds,
                        watch=list(args.watch), knowledge_dirs=[str(d) for d in spec.site_dirs], workers=args.workers,
                        parse_processes=args.parse_processes,
                        job_tokens=job_tokens, allowed_hosts=[*args.allowed_host, *_bind_names(args.host)],
                        diagnosis_timeout_seconds=args.diagnosis_timeout_seconds,
                        watch_reconcile_seconds=args.watch_reconcile_seconds, hang_alert_on=args.hang_alert_on,
                        **({"trusted_proxies": args.trusted_proxy} if args.trusted_proxy else {}))
    print(f"eroica serve: http://{args.host}:{args.port}/ ({url.split('@')[-1]})", flush=True)
    # what it trusts, said once at start: who may write and read, and what each watched root may write
    writes = ("writes need the service's token" + (f" or one of {len(job_tokens)} job tokens" if job_tokens else "")
              if token is not None else "no --token-file: writes are open to every user of this machine")
    reads = "reads need a token (--read-token)" if args.read_token else "reads are open to whoever reaches it"
    print(f"eroica serve: {writes}; {reads}", flush=True)
    for root, glob in scopes:
        print(f"eroica serve: watching {root} for jobs matching {glob!r}", flush=True)
    # the request threads hand the GIL over every 0.5 ms instead of 5: a thread holding the database's
    # write turn gets back to it between its statements without waiting behind another request's
    # validation (8 uploading threads: see bench/serve.py)
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as exc:
        print(f"eroica serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return serve(settings, sock, args.http_processes, _serve_one)
