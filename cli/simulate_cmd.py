"""`eroica simulate`: pattern files of a SIMULATED GPU fleet (eroica.lab.simulate), ground truth beside."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from eroica.lab.simulate import FAULTS, simulate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("SIMULATED pattern files of one profiling window of a GPU job (not real hardware), with the "
                     "ground truth beside them in ground_truth.json: for trying the engine at fleet scale")
    p.add_argument("--ranks", type=int, default=64, help="ranks of the simulated job (default: %(default)s)")
    p.add_argument("--fault", choices=FAULTS, default="gpu_throttled",
                   help="the fault to simulate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed: the culprit ranks and the noise (default: %(default)s)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (process groups named 'pp')")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel group size (ranks of a host share one)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel groups: experts of unequal load by design")
    p.add_argument("--packed", action="store_true", help="one host-<name>.jsonl per host instead of a file per rank")
    p.add_argument("--culprits", type=int, default=1, help="ranks the fault hits (the same fault on each)")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="a new or empty directory for the window's pattern files and ground_truth.json")
    p.add_argument("--replace", action="store_true",
                   help="remove an earlier simulation in --output first (a directory holding its ground_truth.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    why = None
    if min(args.ranks, args.pp, args.tp, args.ep) < 1 or args.ranks % (args.pp * args.tp):
        why = "--ranks must be a positive multiple of --pp x --tp"
    elif (args.ranks // (args.pp * args.tp)) % args.ep:
        why = "the data-parallel size (ranks / (pp x tp)) must be a multiple of --ep"
    elif not 1 <= args.culprits <= args.ranks:
        why = "--culprits must be between 1 and --ranks"
    elif args.replace and args.output.is_dir() and not (args.output / "ground_truth.json").is_file():
        why = f"{args.output} holds no earlier simulation (no ground_truth.json): --replace removes only a simulation"
    elif args.replace and args.output.is_dir():
        shutil.rmtree(args.output)
    elif args.output.exists() and (not args.output.is_dir() or any(args.output.iterdir())):
        # an earlier simulation's rank files would stay beside the new ones, and be diagnosed with them
        why = (f"{args.output} exists and is not an empty directory: name a new directory, or --replace an earlier "
               "simulation (its files left there would be diagnosed with the new ones)")
    if why is not None:
        print(f"eroica simulate: {why}", file=sys.stderr)
        return 2
    truth = simulate(args.output, args.ranks, args.fault, args.seed, args.pp, args.packed, args.tp, args.ep,
                     args.culprits)
    print(f"simulated {args.ranks} ranks, fault {args.fault} on ranks {truth['ranks']}: {args.output} "
          f"(ground truth in ground_truth.json)")
    return 0
