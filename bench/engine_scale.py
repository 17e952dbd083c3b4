"""Diagnosis time and peak memory at fleet scale, on simulated windows (eroica simulate).

Each size runs in its own process (peak RSS is per process): simulate N ranks with a GPU fault
(pattern files packed one per host), then time `diagnose` alone.
Usage: python bench/engine_scale.py [N ...]   (default 1000 10000)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from eroica.cli.simulate import simulate
from eroica.engine.diagnose import DiagnoseOptions, diagnose
n, out = int(sys.argv[1]), Path(sys.argv[2])
t0 = time.perf_counter()
truth = simulate(out, n, "gpu_throttled", seed=1, pp=4, packed=True)
t_sim = time.perf_counter() - t0
t0 = time.perf_counter(); d = diagnose(out); t_diag = time.perf_counter() - t0
top = d.windows[0].findings[0] if d.windows[0].findings else None
print(json.dumps({"ranks": n, "simulate_s": round(t_sim, 2), "diagnose_s": round(t_diag, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "truth": truth["ranks"], "top": None if top is None else [top.root_cause, top.ranks,
                                                                           round(top.confidence, 2)]}))
"""


def main(sizes: list[int]) -> int:
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="eroica-scale-") as tmp:
            res = subprocess.run([sys.executable, "-c", CHILD, str(n), tmp], capture_output=True, text=True)
            if res.returncode != 0:
                print(f"{n} ranks: failed\n{res.stderr[-2000:]}")
                return 1
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"{r['ranks']:>7} ranks: diagnose {r['diagnose_s']:7.2f} s, peak RSS {r['peak_rss_mb']:6d} MB "
                  f"(simulate {r['simulate_s']:.1f} s); truth {r['truth']} -> top finding {r['top']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main([int(a) for a in sys.argv[1:]] or [1000, 10000]))
