"""How much one re-run of a job differs from the next, as `eroica draft --verify` measures it.

Runs a job N times the way the verification re-runs it (attached by eroica, a window forced at
--window-step, the policy's window 20 steps), and prints for each run its healthy step (every rank's
steps at the reference positions), its step after the onset (from --slow-from-step up to the window,
outside windows) and the ratio of the two: what the verdict judges. On a job without a slowdown the
ratios are the verdict's null distribution; `run_spread` of the ratios is the estimate the verification's
tolerance derives from each side's re-runs (of the healthy steps, its check that a draft does not slow
the healthy job). Default: the blocking-metrics script of the verification tests, never slow.

    .venv/bin/python bench/verify_spread.py --runs 10
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=ROOT / "tests" / "e2e" / "verify_repos" / "blocking_metrics")
    p.add_argument("--job-args", default="--steps 80 --slow-from 100000", help="the script's arguments")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--window-step", type=int, default=50)
    p.add_argument("--reference", default="10-25", help="the healthy steps (first-last)")
    p.add_argument("--slow-from-step", type=int, default=34)
    args = p.parse_args()
    os.environ["EROICA_POLICY_WINDOW_STEPS"] = "20"       # before the collector's policy is read
    from eroica.assistant.verify import measure, run_spread
    from eroica.cli.draft_cmd import runner

    lo, hi = (int(x) for x in args.reference.split("-"))
    command = (f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc-per-node 4 train.py "
               f"{args.job_args}")
    run = runner(args.window_step)
    healthy: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="eroica-spread-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(args.repo, repo)
        for i in range(args.runs):
            out = Path(tmp) / f"run-{i}"
            failed = run(command, repo, out, 600)
            m = measure(out, [1], None, range(lo, hi + 1), args.slow_from_step)
            if failed or m.reference_seconds is None or m.reference_ratio is None or m.step_seconds is None:
                print(f"run {i}: {failed or m.why or 'no healthy steps measured'}", flush=True)
                continue
            healthy.append(m.reference_seconds)
            ratios.append(m.reference_ratio)
            print(f"run {i}: healthy {m.reference_seconds * 1000:.1f} ms, step {m.step_seconds * 1000:.1f} ms "
                  f"({m.step_from}), ratio {m.reference_ratio:.3f}", flush=True)
    if len(ratios) < 2:
        return 1
    print(f"ratios: {', '.join(f'{r:.3f}' for r in sorted(ratios))}; stdev {statistics.stdev(ratios):.3f}")
    print(f"healthy steps' relative stdev {statistics.stdev(healthy) / statistics.mean(healthy):.3f}; "
          f"run_spread of consecutive threes, ratios: "
          + ", ".join(f"{run_spread(tuple(ratios[k:k + 3])):.3f}" for k in range(0, len(ratios) - 2, 3))
          + "; healthy steps: "
          + ", ".join(f"{run_spread(tuple(healthy[k:k + 3])):.3f}" for k in range(0, len(healthy) - 2, 3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
