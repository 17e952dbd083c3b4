"""eroica serve under load: K jobs x R ranks post their windows, step summaries, hang snapshots and
job ends concurrently through the collector's own sink, for a bounded time, to `eroica serve`
replicas on 127.0.0.1: SQLite with one replica, then PostgreSQL with two on one database (where
initdb/pg_ctl exist). Afterwards every submitted document must be stored exactly once and every
window diagnosed exactly once; throughput, p50/p95/p99 latency by kind, what the ranks' own thread
paid per submit, and the service's peak memory (its worker processes included) are printed.

Usage: python bench/load.py [--jobs 16] [--ranks 8] [--windows 8] [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from load_support import TOKEN, Replica, all_good, drain_spools, verify, wait_diagnosed  # noqa: E402
from service_support import PG, database  # noqa: E402

from eroica.lab.loadgen import Load, LoadSpec  # noqa: E402


def scenario(kind: str, replicas: int, spec: LoadSpec) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="eroica-load-") as tmp_s, database(kind, Path(tmp_s)) as url:
        tmp = Path(tmp_s)
        reps = [Replica(tmp, url, f"{kind}-{i}").start() for i in range(replicas)]
        try:
            # the jobs are spread over the replicas, as a load balancer would
            loads = [Load(reps[i % replicas].url, TOKEN, LoadSpec(**{**spec.__dict__, "tag": f"{kind}-{i}",
                                                                    "jobs": spec.jobs // replicas}), tmp / f"runs-{i}")
                     for i in range(replicas)]
            t0 = time.time()
            for ld in loads:
                ld.start()
            for ld in loads:
                ld.join(spec.seconds * 3 + 120)
            upload = time.time() - t0
            drained = [drain_spools(ld, reps[0].url) for ld in loads]
            for ld in loads:
                wait_diagnosed(url, ld, 600)
            to_diagnosed = time.time() - t0
            checks = [verify(url, ld) for ld in loads]
        finally:
            for r in reps:
                r.stop()
        reports = [ld.report() for ld in loads]
        ok = sum(r["requests_ok"] for r in reports)  # type: ignore[misc]
        return {
            "database": kind, "replicas": replicas, "jobs": spec.jobs, "ranks": spec.ranks,
            "windows_per_job": spec.windows,
            "requests_ok": ok, "requests_failed": sum(r["requests_failed"] for r in reports),  # type: ignore[misc]
            "requests_per_second": round(ok / upload, 1), "upload_seconds": round(upload, 1),
            "seconds_to_all_diagnosed": round(to_diagnosed, 1),
            "latency_ms": [r["latency_ms"] for r in reports],
            "submit_max_ms": max(r["submit_max_ms"] for r in reports),  # type: ignore[type-var]
            "submit_cpu_max_ms": max(r["submit_cpu_max_ms"] for r in reports),  # type: ignore[type-var]
            "peak_rss_mb_per_replica": [round(r.peak_rss_bytes / 2**20) for r in reps],
            "spools_drained_after": drained,
            "exactly_once": all(all_good(c) for c in checks),
            "checks": checks,
        }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    spec = LoadSpec(jobs=args.jobs, ranks=args.ranks, windows=args.windows, seconds=args.seconds)
    out = [scenario("sqlite", 1, spec)]
    if PG and not args.no_postgres:
        out.append(scenario("postgresql", 2, spec))
    for r in out:
        print(json.dumps(r, indent=1))
    print("\n| database | replicas | jobs x ranks | windows | requests ok | req/s | p50 / p95 / p99 ms | "
          "submit max ms (CPU) | peak RSS MB | stored once | diagnosed once |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out:
        lat = [x["all"] for x in r["latency_ms"]]  # type: ignore[attr-defined]
        p = {q: max(x[q] for x in lat) for q in ("p50", "p95", "p99")}
        c = r["checks"]
        print(f"| {r['database']} | {r['replicas']} | {r['jobs']} x {r['ranks']} | "
              f"{sum(x['windows'] for x in c)} | {r['requests_ok']} | {r['requests_per_second']} | "  # type: ignore[union-attr]
              f"{p['p50']} / {p['p95']} / {p['p99']} | {r['submit_max_ms']} ({r['submit_cpu_max_ms']}) | "
              f"{r['peak_rss_mb_per_replica']} | "
              f"{all(x['documents_stored'] == x['documents_submitted'] for x in c)} | "  # type: ignore[union-attr]
              f"{all(not x['windows_diagnosed_twice'] and x['windows_done'] == x['windows'] for x in c)} |")  # type: ignore[union-attr]
    return 0 if all(r["exactly_once"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
