"""`eroica eval [DIR]`: replay every recorded incident and print the diagnosis-yield table."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median

from eroica.engine.diagnose import DiagnoseOptions
from eroica.engine.errors import EngineError
from eroica.engine.evaluate import IncidentResult, evaluate_incident, find_incidents


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="replay recorded incidents and score diagnosis yield")
    p.add_argument("dir", nargs="?", type=Path, default=Path("incidents"))
    p.add_argument("-v", "--verbose", action="store_true", help="one line per incident")
    p.set_defaults(func=run)


def table(results: list[IncidentResult]) -> str:
    by: dict[str, list[IncidentResult]] = defaultdict(list)
    for r in results:
        for c in r.causes or ["(healthy)"]:
            by[c].append(r)
    lines = [f"{'root cause':<22}{'incidents':>10}{'correct':>9}{'yield':>8}{'false':>7}"
             f"{'onset->window (steps)':>24}{'window':>8}"]
    for cause in sorted(by, key=lambda c: (c == "(healthy)", c)):
        rs = by[cause]
        ok = sum(r.correct for r in rs)
        false = sum(r.false_findings for r in rs)
        lat = [r.onset_to_window_steps for r in rs if r.onset_to_window_steps is not None]
        win = [r.window_steps for r in rs if r.window_steps is not None]
        lat_s = f"{median(lat):.0f} (max {max(lat)})" if lat else "-"
        lines.append(f"{cause:<22}{len(rs):>10}{ok:>9}{ok / len(rs):>8.0%}{false:>7}{lat_s:>24}"
                     f"{(f'{median(win):.0f}' if win else '-'):>8}")
    faulty = [r for r in results if not r.healthy]
    healthy = [r for r in results if r.healthy]
    ok = sum(r.correct for r in faulty)
    lines.append("")
    lines.append(f"faulty incidents diagnosed correctly: {ok}/{len(faulty)}"
                 f" ({ok / len(faulty):.1%})" if faulty else "no faulty incidents")
    lines.append(f"healthy runs with a finding at >= min confidence: "
                 f"{sum(1 for r in healthy if r.false_findings)}/{len(healthy)}")
    total = sum(r.correct for r in results)
    lines.append(f"overall yield: {total}/{len(results)} ({total / len(results):.1%})" if results else "")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        incs = find_incidents(args.dir)
    except EngineError as exc:
        print(f"eroica eval: {exc}", file=sys.stderr)
        return 2
    if not incs:
        print(f"eroica eval: no incidents (folders with expected.yaml) under {args.dir}", file=sys.stderr)
        return 2
    results = []
    for i, inc in enumerate(incs, 1):
        r = evaluate_incident(inc, DiagnoseOptions(in_process=True))
        results.append(r)
        if args.verbose or not r.correct:
            mark = "ok  " if r.correct else "FAIL"
            print(f"[{i}/{len(incs)}] {mark} {r.id} ({', '.join(r.causes) or 'healthy'})"
                  + ("" if r.correct else ": " + "; ".join(r.reasons)))
    print(table(results))
    return 0 if all(r.correct for r in results) else 1
