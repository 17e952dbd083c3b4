"""`eroica run [--out RUN_DIR | --sink URL] [--policy FILE] -- CMD ...`: the user's command, unchanged,
with every rank instrumented from inside (zero-code attach: `eroica.collector.boot`).

The command's environment gets EROICA_ATTACH=1 and the bootstrap directory first on PYTHONPATH (its
`sitecustomize.py` starts the bootstrap, then the environment's own sitecustomize), plus the run
directory, sink, job name, step mode and policy the options name. The command's exit status is
eroica run's; signals reach it; eroica adds nothing to its output but one line before and after.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eroica.cli.policy_cmd import load_policy
from eroica.collector import boot
from eroica.collector.hang_probe import FR_DEFAULT, FR_ENV
from eroica.collector.policy import TriggerPolicy

BOOTSTRAP = Path(boot.__file__).parent / "bootstrap"
PTH_LINE = "import eroica.collector.boot\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "eroica run [options] -- torchrun --nproc-per-node 4 train.py ..."
    p.add_argument("-o", "--out", type=Path, help="the run directory every rank writes to (default "
                                            "./eroica-runs/run-<time>)")
    p.add_argument("--sink", help="send each window to a service (eroica serve) at this URL")
    p.add_argument("--policy", type=Path, help="a YAML/JSON file of trigger policy fields (eroica policy show)")
    p.add_argument("--job", help="the job's name (a restart keeps it; default: the scheduler's)")
    p.add_argument("--step", help="what ends a step: optimizer (default), dataloader, or module:function")
    p.add_argument("--print-pth", action="store_true",
                   help="print the one-line .pth file a platform image installs in site-packages instead "
                        "(it attaches when EROICA_ATTACH=1), and exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command and its arguments, after --")
    p.set_defaults(func=run)


def policy_env(policy: TriggerPolicy) -> dict[str, str]:
    """The policy's non-default fields as EROICA_POLICY_<FIELD> (how every rank reads it)."""
    default = TriggerPolicy().model_dump()
    out = {}
    for name, value in policy.model_dump().items():
        if value != default[name]:
            out[f"EROICA_POLICY_{name.upper()}"] = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    return out


def attach_env(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env[boot.ATTACH_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    out = args.out or Path("eroica-runs") / time.strftime("run-%Y%m%d-%H%M%S")
    env["EROICA_OUT"] = str(out.resolve())
    if args.sink:
        env["EROICA_SINK"] = args.sink
    if args.job:
        env["EROICA_JOB_NAME"] = args.job
    if args.step:
        env["EROICA_STEP"] = args.step
    env.setdefault(FR_ENV, FR_DEFAULT)     # torch's Flight Recorder: every collective's sequence id and sizes
    if args.policy:
        env.update(policy_env(load_policy(args.policy)))
    return env


def run(args: argparse.Namespace) -> int:
    if args.print_pth:
        print(PTH_LINE, end="")
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        print("eroica run: no command: eroica run [options] -- torchrun --nproc-per-node 4 train.py", file=sys.stderr)
        return 2
    try:
        env = attach_env(args, dict(os.environ))
    except (OSError, ValueError) as exc:
        print(f"eroica run: {exc}", file=sys.stderr)
        return 2
    out = env["EROICA_OUT"]
    print(f"eroica run: watching every rank of `{' '.join(cmd)[:200]}`; windows in {out}"
          + (f", sent to {args.sink}" if args.sink else ""), file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"eroica run: cannot start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127
    forward = {s: signal.signal(s, lambda n, _f: proc.send_signal(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in forward.items():
            signal.signal(s, h)
    from eroica.schema.files import is_pattern_file

    found = [p for p in Path(out).glob("*/*") if is_pattern_file(p)] if Path(out).is_dir() else []
    windows = len({p.parent for p in found})
    hangs = len(list(Path(out).glob("hang-s*"))) if Path(out).is_dir() else 0
    said = f"{windows} window(s)" + (f" and {hangs} stall(s) with hang snapshots" if hangs else "")
    print(f"eroica run: the command exited {rc}; {said} in {out}"
          + (f": eroica diagnose {out}" if windows or hangs else ""), file=sys.stderr, flush=True)
    return rc
