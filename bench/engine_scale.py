"""Diagnosis time and peak memory at fleet scale, on simulated windows (eroica simulate).

For each size: simulate N GPU ranks of a DP x TP=8 x PP=5 job with one throttled GPU (pattern files
packed one per host, about 10 KB per rank; on every core), then, in a fresh process, time `diagnose`
alone (load, peer comparison, rules, report data) on one core and on every core (`workers`: the
window's files parsed in forked processes, as `eroica diagnose` does), and rendering its JSON and
HTML. Peak memory is the parent's peak RSS plus its largest worker's (an upper bound of the sum).
The baseline of the ratio is the smallest size: time per rank should stay flat as N grows.
Usage: python bench/engine_scale.py [N ...]   (default 1000 10000 100000; N a multiple of 40)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

SIMULATE = r"""
import sys, time
from pathlib import Path
from eroica.lab.simulate import simulate
t0 = time.perf_counter()
simulate(Path(sys.argv[2]), int(sys.argv[1]), "gpu_throttled", seed=1, tp=8, pp=5, packed=True)
print(time.perf_counter() - t0)
"""

DIAGNOSE = r"""
import json, os, resource, sys, time
from pathlib import Path
from eroica.engine import DiagnoseOptions, diagnose
from eroica.engine import render
out = Path(sys.argv[1])
workers = os.cpu_count() if sys.argv[2] == "all" else 1
truth = json.loads((out / "ground_truth.json").read_text())
t0 = time.perf_counter(); d = diagnose(out, DiagnoseOptions(workers=workers)); t_diag = time.perf_counter() - t0
t0 = time.perf_counter(); js = render(d, "json"); html = render(d, "html"); t_render = time.perf_counter() - t0
top = d.windows[0].findings[0] if d.windows[0].findings else None
print(json.dumps({"diagnose_s": round(t_diag, 2), "render_s": round(t_render, 2),
                  "json_mb": round(len(js) / 1e6, 1), "html_mb": round(len(html) / 1e6, 2),
                  "peak_rss_mb": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024),
                  "truth": truth["ranks"], "top": None if top is None else [top.root_cause, top.ranks,
                                                                           round(top.confidence, 2)]}))
"""


def main(sizes: list[int]) -> int:
    base = None
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="eroica-scale-") as tmp:
            sim = subprocess.run([sys.executable, "-c", SIMULATE, str(n), tmp], capture_output=True, text=True)
            if sim.returncode != 0:
                print(f"{n} ranks: simulate failed\n{sim.stderr[-2000:]}")
                return 1
            for mode in ("one", "all"):
                res = subprocess.run([sys.executable, "-c", DIAGNOSE, tmp, mode], capture_output=True, text=True)
                if res.returncode != 0:
                    print(f"{n} ranks: diagnose failed\n{res.stderr[-2000:]}")
                    return 1
                r = json.loads(res.stdout.strip().splitlines()[-1])
                per_rank = r["diagnose_s"] / n * 1e6
                if mode == "one":
                    base = base or per_rank
                print(f"{n:>7} ranks, {mode} core{'s' if mode == 'all' else ''}: diagnose {r['diagnose_s']:7.2f} s "
                      f"({per_rank:5.0f} us/rank, x{per_rank / base:.2f} the smallest size's on one core), peak "
                      f"RSS {r['peak_rss_mb']:6d} MB; render json+html {r['render_s']:.1f} s ({r['json_mb']} MB + "
                      f"{r['html_mb']} MB); simulate {float(sim.stdout):.1f} s (simulate/diagnose "
                      f"{float(sim.stdout) / r['diagnose_s']:.2f}); truth {r['truth']} -> top finding {r['top']}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main([int(a) for a in sys.argv[1:]] or [1000, 10000, 100000]))
