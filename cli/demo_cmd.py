"""`eroica demo`: a real 4-rank job, a real fault, eroica's own detector, a diagnosis."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from eroica.engine import diagnose, render
from eroica.lab.launch import launch
from eroica.lab.workload import FAULTS

HEALTHY_FORCED_WINDOW_STEP = 40   # after warm-up and a full detector reference


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fault", choices=FAULTS, default="dataloader_stall", help="fault to inject (default: %(default)s)")
    p.add_argument("--rank", type=int, default=1, help="rank to inject it on (default: %(default)s)")
    p.add_argument("--fault-step", type=int, default=25, help="healthy steps before the fault (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=4, help="ranks (processes) in the job (default: %(default)s)")
    p.add_argument("--steps", type=int, default=90,
                   help="stop after this many steps if no window opened (default: %(default)s)")
    p.add_argument("-o", "--out", type=Path, default=None, help="run directory (default: runs/demo-<fault>-<time>)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.rank < args.world_size:
        print(f"eroica demo: --rank {args.rank} is not a rank of a {args.world_size}-rank job")
        return 2
    out = args.out or Path("runs") / f"demo-{args.fault}-{time.strftime('%Y%m%d-%H%M%S')}"
    env = {}
    if args.fault == "none":
        env["EROICA_FORCE_WINDOW_AT_STEP"] = str(HEALTHY_FORCED_WINDOW_STEP)
        print(f"eroica demo: {args.world_size}-rank gloo job, no fault; one window is forced at step "
              f"{HEALTHY_FORCED_WINDOW_STEP} to show a healthy diagnosis")
    else:
        print(f"eroica demo: {args.world_size}-rank gloo job; fault {args.fault!r} on rank {args.rank} "
              f"from step {args.fault_step}; the detector decides when to profile")
    print(f"  run directory: {out}")
    try:
        res = launch(out, world_size=args.world_size, fault=args.fault, fault_rank=args.rank,
                     fault_step=args.fault_step, steps=args.steps, env=env)
    except (RuntimeError, OSError) as exc:
        print(f"eroica demo: cannot set up the fault {args.fault!r}: {exc}")
        return 2
    for note in res.notes:
        print(f"  note: {note}")
    if not res.ok:
        print(f"eroica demo: the training job failed (exit codes {res.returncodes}"
              f"{', timed out' if res.timed_out else ''}); last lines of each rank's log:")
        for r, text in res.logs.items():
            tail = [ln for ln in text.splitlines() if "USDT" not in ln][-8:]
            print(f"--- rank {r} ---\n" + "\n".join(tail))
        return 1
    windows = [d for d in out.iterdir() if d.is_dir() and d.name.startswith("w")]
    print(f"  job finished in {res.wall_seconds:.0f} s; {len(windows)} profiling window(s) written")
    if not windows:
        print("eroica demo: the detector saw no slowdown, so no window opened and there is nothing to diagnose")
        return 0 if args.fault == "none" else 1
    d = diagnose(out)
    for fmt, name in (("json", "diagnosis.json"), ("md", "diagnosis.md"), ("text", "diagnosis.txt"),
                      ("html", "report.html")):
        (out / name).write_text(render(d, fmt))
    print()
    print(render(d, "text").rstrip())
    print()
    print(f"full reports: {out / 'report.html'} (open in a browser), {out / 'diagnosis.md'}, "
          f"{out / 'diagnosis.json'}")
    print(f"pattern files: {out}/<window>/rank-<R>.json; re-run with: eroica diagnose {out}")
    return 0
