"""`eroica record`: run a lab job with a real fault and keep its windows as an incident (eroica.lab.record)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eroica.lab.record import WORKLOADS, RecordSpec, record
from eroica.lab.workload import FAULTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fault", required=True, help=f"one of {', '.join(FAULTS)}, or several separated by commas")
    p.add_argument("--rank", default="1",
                   help="the rank the fault is injected on, or one rank per fault separated by commas "
                        "(default: %(default)s)")
    p.add_argument("--force-step", type=int, default=24,
                   help="healthy runs: the step of the forced window (default: %(default)s; --random draws it)")
    p.add_argument("--id", required=True, help="incident id, e.g. INC-0001")
    p.add_argument("-o", "--out", "--dir", dest="dir", type=Path, default=Path("incidents"),
                   help="the incident library the incident is written to, as DIR/ID (default: %(default)s)")
    p.add_argument("--fault-step", type=int, default=25,
                   help="the step the fault starts at, its onset (default: %(default)s; --random draws it)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="demo",
                   help="demo: the job the rules were written on; lm: the held-out job (incidents/heldout/) "
                        "(default: %(default)s)")
    p.add_argument("--random", type=int, metavar="SEED", default=None,
                   help="pick the culprit rank, the fault's strength and its onset at random (written down)")
    p.add_argument("--heterogeneous", action="store_true",
                   help="ranks do different work by design in several levels (lm: --graded; demo: --graded-by-design)")
    p.add_argument("--history-window", type=int, metavar="STEP", default=None,
                   help="faulty runs: force a window at STEP, before the fault (the job's healthy history)")
    p.add_argument("--window-at", type=int, metavar="STEP", default=None,
                   help="faulty runs: a window requested at STEP, after the onset (a person who saw the job slow "
                        "asked for it: `eroica control --window-now`), whether or not the detector fires")
    p.add_argument("--netns", action="store_true", help="every rank in its own network namespace (links of "
                   "their own, none capped unless the fault is nic_degraded)")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="extra workload arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return record(RecordSpec(
        fault=args.fault, id=args.id, rank=args.rank, force_step=args.force_step, dir=args.dir,
        fault_step=args.fault_step, workload=args.workload, random=args.random, heterogeneous=args.heterogeneous,
        history_window=args.history_window, window_at=args.window_at, netns=args.netns, extra=list(args.extra)))
