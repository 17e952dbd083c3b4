"""Trace analysis, side by side with HTA: `eroica diagnose TRACES` end to end (a fresh process:
start-up, ingestion on every core, peer comparison, rules, the text report) against Holistic Trace
Analysis's `TraceAnalysis(trace_dir=...)` load alone, in one run, on the same files.

    python bench/traces.py [--repeat 5] [--no-big] [--hta-python PATH]

Sets: the shared 8-rank DLRM and 2-rank HTA traces (../shared/traces), and a 100+ MB 4-rank trace
made here by a real profiled job (bench/make_trace.py, kept in build/bench-traces/). HTA runs in
its own virtual environment (`make bench-traces` makes .hta-venv with HolisticTraceAnalysis 0.5.0);
without it the comparison is skipped with that reason and eroica's own numbers still print.
Memory is the peak of the summed RSS of the whole process tree (both tools use worker processes),
sampled every 10 ms. The tools' runs alternate, so the machine's drift hits both alike."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
BIG = ROOT / "build" / "bench-traces" / "big"
HTA_LOAD = """
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
print("HTA-RESULT " + json.dumps({"import_seconds": t1 - t0, "load_seconds": t2 - t1}))
"""


def run_measured(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """Wall seconds, peak MB of the summed RSS of the process tree, stdout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        try:
            root = psutil.Process(p.pid)
        except psutil.Error:
            return
        while not stop.is_set():
            try:
                rss = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                peak[0] = max(peak[0], rss / 2**20)
            except psutil.Error:
                pass
            stop.wait(0.01)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = p.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    t.join()
    if p.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}")
    return wall, peak[0], out


def eroica_once(trace_dir: Path) -> tuple[float, float]:
    exe = Path(sys.executable).parent / "eroica"
    # exit 3: reported, not diagnosable (the shared 2-rank set holds 2 of 128 ranks)
    wall, peak, _ = run_measured([str(exe), "diagnose", str(trace_dir)], ok=(0, 1, 3))
    return wall, peak


def hta_once(python: Path, trace_dir: Path) -> tuple[float, float, float]:
    wall, peak, out = run_measured([str(python), "-c", HTA_LOAD, str(trace_dir)])
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("HTA-RESULT "))[11:])
    return wall, peak, res["load_seconds"]


def compare(trace_dir: Path, repeat: int, python: Path | None) -> tuple[dict[str, float], dict[str, float] | None]:
    """`repeat` runs of each tool, alternating (eroica, HTA, eroica, ...): this machine's speed drifts
    by tens of percent within minutes, and alternating puts both tools under the same drift."""
    e_runs, h_runs = [], []
    for _ in range(repeat):
        e_runs.append(eroica_once(trace_dir))
        if python is not None:
            h_runs.append(hta_once(python, trace_dir))
    e = {"wall_seconds": statistics.median(r[0] for r in e_runs), "peak_mb": max(r[1] for r in e_runs)}
    h = None if python is None else {
        "wall_seconds": statistics.median(r[0] for r in h_runs), "peak_mb": max(r[1] for r in h_runs),
        "load_seconds": statistics.median(r[2] for r in h_runs)}
    return e, h


def hta_python(arg: str | None) -> tuple[Path | None, str]:
    cand = Path(arg or os.environ.get("EROICA_HTA_PYTHON") or ROOT / ".hta-venv" / "bin" / "python")
    if not cand.exists():
        return None, f"no HTA interpreter at {cand} (make bench-traces installs HolisticTraceAnalysis into .hta-venv)"
    ok = subprocess.run([str(cand), "-c", "import hta.trace_analysis"], capture_output=True)
    if ok.returncode != 0:
        return None, f"{cand} cannot import hta.trace_analysis (pip install HolisticTraceAnalysis into that venv)"
    return cand, ""


def big_trace() -> Path:
    if not sorted(BIG.glob("job_rank*.pt.trace.json")):
        print(f"making the big trace (a real 4-rank profiled job) in {BIG} ...", flush=True)
        subprocess.run([sys.executable, str(ROOT / "bench" / "make_trace.py"), str(BIG)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return BIG


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="eroica diagnose on traces against HTA's load, in one run")
    p.add_argument("--repeat", type=int, default=5, help="runs per tool and set (the median is reported)")
    p.add_argument("--no-big", action="store_true", help="skip the 100+ MB generated trace")
    p.add_argument("--hta-python", default=None, help="the interpreter of a venv with HolisticTraceAnalysis")
    args = p.parse_args(argv)
    sets = [("DLRM 8 ranks (shared)", SHARED / "param" / "dlrm_kineto_8rank"),
            ("HTA 2 ranks (shared)", SHARED / "hta" / "trace_filter_sampled_2rank")]
    if not args.no_big:
        sets.append(("generated 4 ranks", big_trace()))
    py, why = hta_python(args.hta_python)
    if py is None:
        print(f"HTA comparison skipped: {why}")
    rows = []
    for name, d in sets:
        size = sum(f.stat().st_size for f in d.iterdir() if f.is_file()) / 1e6
        e, h = compare(d, args.repeat if size < 50 else min(args.repeat, 3), py)
        rows.append((name, size, e, h))
        line = f"{name:<24} {size:7.1f} MB  eroica diagnose {e['wall_seconds']:6.2f} s {e['peak_mb']:6.0f} MB"
        if h is not None:
            line += (f" | HTA load {h['load_seconds']:6.2f} s (process {h['wall_seconds']:5.2f} s) "
                     f"{h['peak_mb']:6.0f} MB"
                     f" | eroica/HTA-load {e['wall_seconds'] / h['load_seconds']:.2f}x time, "
                     f"{e['peak_mb'] / h['peak_mb']:.2f}x memory")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
