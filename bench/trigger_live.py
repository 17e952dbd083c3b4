"""Live detection delay, before and after quiet-window backoff, in one run.

`bench/trigger.py` replays recorded step-time series; this runs the real thing. Each run is the
demo's 4-rank job with eroica attached, a short job-wide bump early on (every rank sleeps
`--bump-seconds` for 4 steps: a shared machine's burst, which opens a window that then finds the job
no slower: a quiet one), and a real fault on one rank later. Each (fault, seed) runs under the policy
before (`quiet_backoff_steps=0`) and after (the default), in shuffled order, and reports the steps
from the fault's onset to the first window that opened at or after it (a window opens `lead_steps`
after the ranks agree, so the delay includes that lead), and whether the bump's window opened.

    .venv/bin/python bench/trigger_live.py [--seeds 2] [--faults dataloader_stall,cpu_contention] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

WINDOW = re.compile(r"^w\d+-s(\d+)$")
POLICIES = {"before": {"EROICA_POLICY_QUIET_BACKOFF_STEPS": "0"}, "after": {}}


def windows(run: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in run.glob("w*-s*") if (m := WINDOW.match(p.name)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--faults", default="dataloader_stall,cpu_contention")
    p.add_argument("--bump-step", type=int, default=30)
    p.add_argument("--bump-seconds", type=float, default=0.05)
    p.add_argument("--fault-step", type=int, default=100)
    p.add_argument("--steps", type=int, default=170)
    p.add_argument("--keep", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    args = p.parse_args()

    from eroica.collector.policy import TriggerPolicy
    from eroica.lab.launch import launch

    root = args.keep or Path(tempfile.mkdtemp(prefix="eroica-trigger-live-"))
    runs = [(f, s, pol) for f in args.faults.split(",") for s in range(args.seeds) for pol in POLICIES]
    random.Random(0).shuffle(runs)                 # drift and the machine's noise hit both policies alike
    got: dict[tuple[str, int, str], tuple[int | None, bool]] = {}
    for i, (fault, seed, pol) in enumerate(runs, 1):
        out = root / f"{fault}-{seed}-{pol}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.monotonic()
        res = launch(out, fault=fault, fault_rank=1 + seed % 3, fault_step=args.fault_step, steps=args.steps,
                     extra_args=["--stop-after-windows", "1000", "--bump-step", str(args.bump_step),
                                 "--bump-seconds", str(args.bump_seconds)],
                     env={**POLICIES[pol], "PYTHONHASHSEED": str(seed)}, progress=False,
                     timeout_seconds=args.steps * 2.0 + 240)
        ws = windows(out)
        after = [w for w in ws if w >= args.fault_step]
        bumped = any(args.bump_step <= w < args.fault_step for w in ws)
        got[(fault, seed, pol)] = (after[0] - args.fault_step if after else None, bumped)
        print(f"[{i}/{len(runs)}] {fault} seed {seed} {pol}: windows at steps {ws}; onset {args.fault_step} -> "
              f"{got[(fault, seed, pol)][0]} steps; the bump's window {'opened' if bumped else 'did not open'} "
              f"(rc {res.returncodes}, {time.monotonic() - t0:.0f} s)", flush=True)
    lead = TriggerPolicy().lead_steps
    print(f"\nsteps from the fault's onset to its window (the lead of {lead} steps included); runs in {root}")
    print(f"{'fault':<20} {'seed':>4} {'before':>7} {'after':>7}  bump window (before/after)")
    diffs = []
    for fault in args.faults.split(","):
        for s in range(args.seeds):
            b, bb = got[(fault, s, "before")]
            a, ab = got[(fault, s, "after")]
            print(f"{fault:<20} {s:>4} {str(b):>7} {str(a):>7}  {'yes' if bb else 'no'}/{'yes' if ab else 'no'}")
            if a is not None and b is not None:
                diffs.append(a - b)
    missed = sum(1 for (_, _, pol), (d, _) in got.items() if d is None and pol == "after")
    if diffs:
        print(f"delay added by the backoff: median {statistics.median(diffs):+.1f} steps, max {max(diffs):+d}; "
              f"faults with no window after the change: {missed}")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
