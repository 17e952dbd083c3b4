"""`eroica findings list|ack|link|close|export`: a finding's lifecycle from the command line, through
the service's API (`--server`, default http://127.0.0.1:8080; the token from --token-file or
EROICA_TOKEN)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def _connection(p: argparse.ArgumentParser, top: bool) -> None:
    """--server and --token-file, before the sub-command or after it (`findings list --server X`): on the
    sub-commands they default to nothing, so a value given before the sub-command is kept."""
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--server", **({"default": os.environ.get("EROICA_SERVER", "http://127.0.0.1:8080")} if top
                                  else kw),
                   help="the service's URL (default: EROICA_SERVER or http://127.0.0.1:8080)")
    p.add_argument("--token-file", type=Path, **kw,
                   help="a file holding the bearer token (default: EROICA_TOKEN)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _connection(p, top=True)
    fs = p.add_subparsers(dest="findings_cmd", required=True, metavar="{list,ack,link,close,export}")
    ls = fs.add_parser("list", help="issues, newest first")
    _connection(ls, top=False)
    ls.add_argument("--state", help="only issues in this state (open, acknowledged, linked, recovered, ...)")
    ls.add_argument("--job", help="only this job's issues (its id)")
    ls.add_argument("--format", choices=("text", "json"), default="text",
                    help="text for people, json for machines (default: %(default)s)")
    ls.add_argument("--json", action="store_const", const="json", dest="format", help="the same as --format json")
    for name, helptext in (("ack", "acknowledge"), ("link", "link to a ticket or change"),
                           ("close", "close as recovered, not_recovered or false_positive")):
        a = fs.add_parser(name, help=helptext)
        _connection(a, top=False)
        a.add_argument("id", type=int, help="the issue's id (`eroica findings list`)")
        a.add_argument("--who", default=os.environ.get("USER", "unknown"),
                       help="who does it, kept in the issue's history (default: $USER)")
        if name == "link":
            a.add_argument("url", help="ticket URL, change-request id, commit or config change")
            a.add_argument("--kind", default="ticket", choices=["ticket", "change_request", "commit", "config"],
                           help="what the link is (default: %(default)s)")
        if name == "close":
            a.add_argument("state", choices=["recovered", "not_recovered", "false_positive"],
                           help="how it ended: the job recovered, did not, or the finding was wrong")
            a.add_argument("--why", help="required for a false positive")
    ex = fs.add_parser("export", help="write a false positive as an incident directory (a regression case)")
    _connection(ex, top=False)
    ex.add_argument("id", type=int, help="the issue's id (`eroica findings list`)")
    ex.add_argument("out", type=Path, help="the incident directory to create, e.g. incidents/INC-0044")
    p.set_defaults(func=run)


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get("EROICA_TOKEN")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(args.server.rstrip("/") + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def run(args: argparse.Namespace) -> int:
    if "://" not in args.server:
        print(f"eroica findings: --server {args.server}: a URL is expected, e.g. http://{args.server}", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except urllib.error.HTTPError as exc:
        with exc:
            detail = exc.read().decode(errors="replace")[:500]
        print(f"eroica findings: {args.server}: HTTP {exc.code}: {detail}", file=sys.stderr)
        return 1
    except (OSError, urllib.error.URLError) as exc:
        why = getattr(exc, "reason", exc)
        print(f"eroica findings: {args.server}: {why} (is `eroica serve` running there? --server or EROICA_SERVER "
              "names it)", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    c = args.findings_cmd
    if c == "list":
        q = "&".join(f"{k}={v}" for k, v in (("state", args.state), ("job", args.job)) if v)
        rows = _call(args, "GET", "/v1/issues" + (f"?{q}" if q else ""))
        if args.format == "json":
            print(json.dumps(rows, indent=2))
            return 0
        for i in rows:
            print(f"{i['id']:>5}  {i['state']:<14} {i['job_id']:<24} {i['root_cause']:<22} ranks {i['ranks']:<8} "
                  f"{i['windows_total']} window(s), top {i['top_confidence']:.2f}"
                  + (f"  -> {i['link_url']}" if i["link_url"] else ""))
        return 0
    if c == "export":
        exp = _call(args, "GET", f"/v1/issues/{args.id}/incident")
        w = args.out / "patterns" / exp["window"]
        w.mkdir(parents=True, exist_ok=False)
        for d in exp["documents"]:
            (w / f"rank-{json.loads(d)['job']['rank']}.json").write_text(d)
        (args.out / "expected.yaml").write_text(exp["expected_yaml"])
        (args.out / "context.yaml").write_text(exp["context_yaml"])
        print(f"wrote {args.out}: {len(exp['documents'])} rank document(s); eroica eval {args.out.parent} checks it")
        return 0
    body: dict[str, Any] = {"who": args.who}
    action = c
    if c == "link":
        body.update(url=args.url, kind=args.kind)
    if c == "close":
        action = args.state
        if args.why:
            body["why"] = args.why
    i = _call(args, "POST", f"/v1/issues/{args.id}/{action}", body)
    print(f"issue {i['id']}: {i['state']}")
    return 0
