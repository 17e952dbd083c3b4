"""Does the trigger cry wolf? Windows per healthy job-hour, and detection delay on recorded faults,
before and after quiet-window backoff, in one run.

1. Healthy jobs, for real: the demo job and the held-out job (`eroica.lab.workload_lm`), 4 ranks
   on this machine's cores with their own noise, `--seeds` runs each of `--steps` steps, eroica
   attached with its default policy (windows really open: their cost is in the series). Rank 0
   logs every step's time; each series is replayed through the detector and the window rules
   (`eroica policy replay`'s code) under the policy before (`quiet_backoff_steps=0`) and after (the
   default), and the windows are counted per job-hour of that series played end to end for an hour
   (the series repeated: its noise is the machine's, its length a few minutes).
2. Detection delay: every recorded faulty incident (library and held-out) whose series covers the
   fault's onset, replayed under both policies: steps from the onset to the first firing at or
   after it.

    python bench/trigger.py [--steps 1500] [--seeds 2] [--workloads demo,lm] [--keep DIR]
    python bench/trigger.py --series-dir DIR     # replay series recorded earlier (steps-*.txt)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eroica.collector.policy import TriggerPolicy
from eroica.collector.replay import per_hour, read_step_times, replay

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"demo": "eroica.lab.workload", "lm": "eroica.lab.workload_lm"}
BEFORE, AFTER = TriggerPolicy(quiet_backoff_steps=0), TriggerPolicy()


def record(workload: str, seed: int, steps: int, out: Path) -> Path:
    from eroica.lab.launch import launch
    from eroica.lab.workload import STEP_LOG_ENV

    log = out / f"steps-{workload}-{seed}.txt"
    if log.exists() and sum(1 for _ in log.open()) >= steps - 2:
        print(f"  {workload} seed {seed}: recorded already ({log})", flush=True)
        return log
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    res = launch(out / f"{workload}-{seed}", world_size=4, steps=steps, module=MODULES[workload],
                 extra_args=["--stop-after-windows", "1000000"],
                 env={STEP_LOG_ENV: str(log), "PYTHONHASHSEED": str(seed)},
                 timeout_seconds=steps * 2.0 + 300, progress=False)
    wins = sorted(p.name for p in (out / f"{workload}-{seed}").glob("w*-s*"))
    print(f"  {workload} seed {seed}: {steps} steps in {time.monotonic() - t0:.0f} s, rc {res.returncodes}, "
          f"{len(wins)} live window(s) (the default policy, as attached)", flush=True)
    return log


def delays() -> list[tuple[str, int | None, int | None]]:
    """(incident, steps from onset to first firing before, after) for recorded faulty incidents."""
    out = []
    paths = list(ROOT.glob("incidents/INC-*/context.yaml")) + list(ROOT.glob("incidents/heldout/*/context.yaml"))
    for ctx_path in sorted(paths):
        ctx = yaml.safe_load(ctx_path.read_text())
        inj = ctx.get("injected") or {}
        onset, wid = inj.get("from_step"), ctx.get("window")
        if inj.get("fault") in (None, "none") or onset is None or not wid:
            continue
        doc_path = ctx_path.parent / "patterns" / wid / "rank-0.json"
        if not doc_path.exists():
            continue
        doc = json.loads(doc_path.read_text())
        st = doc.get("step_times") or {}
        before, during = st.get("before_seconds") or [], st.get("during_seconds") or []
        start = int(wid.split("-s")[1])
        first = start - len(before)
        if not first <= onset < start + len(during):
            continue
        series = before + during
        got = []
        for pol in (BEFORE, AFTER):
            fired = [w.fired_at_step for w in replay(series, pol) if w.fired_at_step >= onset - first]
            got.append(fired[0] - (onset - first) if fired else None)
        out.append((ctx.get("id", ctx_path.parent.name), got[0], got[1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workloads", default="demo,lm")
    ap.add_argument("--series-dir", type=Path, help="replay the steps-*.txt recorded there; run no job")
    ap.add_argument("--hours", type=float, default=6.0, help="job-hours each series is replayed for")
    ap.add_argument("--keep", type=Path, help="where the runs and series go (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.series_dir:
        logs = sorted(args.series_dir.glob("steps-*.txt"))
    else:
        out = args.keep or Path(tempfile.mkdtemp(prefix="eroica-trigger-"))
        out.mkdir(parents=True, exist_ok=True)
        print(f"healthy jobs (4 ranks, {args.steps} steps each, series in {out}):", flush=True)
        logs = [record(w, s, args.steps, out) for w in args.workloads.split(",") for s in range(args.seeds)]
    print(f"\nwindows per healthy job-hour (each series replayed end to end for {args.hours:g} h):")
    print("| series | steps | median step | before, no budget: 1st h | before: 1st h, per h | "
          "after: 1st h, per h (quiet) |")
    print("|---|---|---|---|---|---|")
    sums = [0.0] * 5
    for log in logs:
        series = read_step_times(log)[10:]          # the first steps: start-up, not the job's noise
        raw, _, _ = per_hour(series, BEFORE.model_copy(update={"max_windows_per_hour": 10**6}), 1.0)
        b1, b, _ = per_hour(series, BEFORE, args.hours)
        a1, a, q = per_hour(series, AFTER, args.hours)
        for i, v in enumerate((raw, b1, b, a1, a)):
            sums[i] += v / len(logs)
        print(f"| {log.stem} | {len(series)} | {statistics.median(series) * 1000:.0f} ms | {raw} | {b1}, {b:.1f} | "
              f"{a1}, {a:.2f} ({q}) |")
    print(f"| mean | | | {sums[0]:.0f} | {sums[1]:.1f}, {sums[2]:.1f} | {sums[3]:.1f}, {sums[4]:.2f} |")
    d = delays()
    same = sum(b == a for _, b, a in d)
    print(f"\ndetection delay on {len(d)} recorded faulty incidents (steps from onset to the first firing): "
          f"the same in {same}")
    for inc, b, a in d:
        if b != a:
            print(f"  {inc}: before {b}, after {a}")
    seen = [(b, a) for _, b, a in d if b is not None and a is not None]
    if seen:
        print(f"  median before {statistics.median(x for x, _ in seen)}, after "
              f"{statistics.median(y for _, y in seen)}; "
              f"missed before {sum(b is None for _, b, _ in d)}, after {sum(a is None for _, _, a in d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
