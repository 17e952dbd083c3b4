"""`eroica control RUN_DIR ...`: change a running job's collectors without restarting it.

    eroica control RUN_DIR --who alice --disable                 # detector off (windows on request only)
    eroica control RUN_DIR --who alice --set threshold_min_ratio=1.3 --set window_steps=20
    eroica control RUN_DIR --who alice --window-now --note "INC-123: slow since 14:02"
    eroica control RUN_DIR --who alice --enable --store 10.0.0.1:29500   # no shared filesystem
    eroica control RUN_DIR --show                                # what was asked, applied, rejected

Without `--store` the request is appended to RUN_DIR/control.jsonl, which the job's rank 0 watches;
with it, the request goes straight to the job's torch.distributed store (MASTER_ADDR:MASTER_PORT).
Either way every rank applies it at the same step, and rank 0 logs it in RUN_DIR/control.log.jsonl.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eroica.collector.control import (
    LOG_FILE,
    ControlRequest,
    append_request,
    log_line,
    publish,
    published_step,
)
from eroica.collector.policy import TriggerPolicy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="the job's run directory (where its windows are written)")
    p.add_argument("--who", default=None, help="who asks (default: user@host); logged with the change")
    on = p.add_mutually_exclusive_group()
    on.add_argument("--enable", action="store_true", help="turn the step-time detector on")
    on.add_argument("--disable", action="store_true", help="turn it off (requested windows still open)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a trigger-policy field (`eroica policy show` lists them); repeatable")
    p.add_argument("--window-now", action="store_true", help="open a profiling window on every rank now")
    p.add_argument("--note", default="", help="why (logged)")
    p.add_argument("--store", default=None, metavar="HOST:PORT",
                   help="publish through the job's torch.distributed store instead of RUN_DIR/control.jsonl")
    p.add_argument("--store-prefix", default="",
                   help="a key prefix, when the job's store is shared with other systems (default: none)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to reach the store (default: %(default)s)")
    p.add_argument("--show", action="store_true", help="print the control log of RUN_DIR and exit")
    p.set_defaults(func=run)


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def build_request(args: argparse.Namespace) -> ControlRequest:
    fields = TriggerPolicy.model_fields
    policy: dict[str, Any] = {}
    for item in args.set:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            known = ", ".join(sorted(fields))
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of: {known}")
        policy[name] = _value(raw)
    enable = True if args.enable else False if args.disable else None
    if enable is None and not policy and not args.window_now:
        raise ValueError("nothing to change: give --enable, --disable, --set FIELD=VALUE or --window-now")
    try:   # each value must be valid for its field; how fields combine depends on the job's policy
        TriggerPolicy.model_validate({**TriggerPolicy().model_dump(), **policy})
    except ValidationError as exc:
        for err in exc.errors():
            if err["loc"] and err["loc"][0] in policy:
                raise ValueError(f"--set {err['loc'][0]}={policy[err['loc'][0]]!r}: {err['msg']}") from exc
    who = args.who or f"{getpass.getuser()}@{socket.gethostname()}"
    return ControlRequest(who=who, enable=enable, policy=policy, window_now=args.window_now, note=args.note)


def _store(address: str, prefix: str, timeout: float) -> Any:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--store {address!r}: expected HOST:PORT (the job's MASTER_ADDR:MASTER_PORT)")
    from torch.distributed import PrefixStore, TCPStore

    tcp = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    return PrefixStore(prefix, tcp) if prefix else tcp


def show(run_dir: Path) -> int:
    path = run_dir / LOG_FILE
    if not run_dir.is_dir():
        print(f"eroica control: {run_dir}: no such run directory (the job's output directory, where its windows "
              "are written)", file=sys.stderr)
        return 2
    if not path.is_file():
        print(f"{path}: no control log yet (no change was applied or rejected)")
        return 0
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            print(f"(unreadable line) {line[:120]}")
            continue
        what = r.get("request", {})
        print(f"{r.get('logged_at', '?')}  #{r.get('seq', '-')}  {r.get('who', '-')}  step {r.get('step', '-')}: "
              f"{r.get('result', '?')}  {json.dumps(what) if what else ''}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.show:
        return show(args.run_dir)
    try:
        req = build_request(args)
    except ValueError as exc:
        print(f"eroica control: {exc}", file=sys.stderr)
        return 2
    if args.store is None:
        path = append_request(args.run_dir, req)
        print(f"request by {req.who} appended to {path}; rank 0 publishes it at its next control poll "
              f"(`eroica control {args.run_dir} --show` lists what was applied)")
        return 0
    try:
        store = _store(args.store, args.store_prefix, args.timeout)
        at = published_step(store)
        if at is None:
            print(f"eroica control: the store at {args.store} has no eroica step yet: is a Monitor running there, "
                  f"past its first {TriggerPolicy().control_poll_steps} steps?")
            return 1
        step, lead = at
        change = publish(store, req, step + lead)
    except ValueError as exc:
        print(f"eroica control: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:   # unreachable store, timeouts
        print(f"eroica control: could not reach the job's store at {args.store}: {exc!r}")
        return 1
    log_line(args.run_dir, {"seq": change.seq, "who": req.who, "at": req.at, "effective_step": change.effective_step,
                            "result": f"published through the store at {args.store}",
                            "request": req.model_dump(exclude_defaults=True)})
    print(f"change #{change.seq} by {req.who} published at {args.store}; every rank applies it at step "
          f"{change.effective_step} (rank 0 was at step {step})")
    return 0
