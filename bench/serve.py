"""eroica serve, measured: time to diagnosis and ingestion at scale, through the real HTTP API.

1. Time to diagnosis: the library's recorded 4-rank windows (incidents/INC-*) are uploaded one
   window at a time to a live `eroica serve` (SQLite); for each, the time from the last rank's
   document being acknowledged to the diagnosis being stored (p50, p95, max). The collector's own
   part (window close to the document's arrival) is the sink's POST, milliseconds on a LAN.
2. Ingestion: a simulated N-rank window (eroica.lab.simulate, gpu_throttled, 8 ranks a host;
   N=10000 by default) is uploaded through the API with 8 concurrent clients, one rank's document
   per request (as before batching) and one host's 8 ranks per request (application/x-ndjson, the
   per-host gather's upload), side by side in one run, on SQLite and (where initdb/pg_ctl exist)
   PostgreSQL: documents/s, first upload to the stored diagnosis, the service's peak memory.
3. Fleet: a 100,000-rank window as 12,500 host documents to two replicas on one PostgreSQL: first
   upload to stored diagnosis, peak memory per replica, and that it was diagnosed once.

Usage: python bench/serve.py [--ranks N] [--fleet-ranks M] [--windows K] [--http-processes P]
(0 skips a part)
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from load_support import TOKEN  # noqa: E402  (the replicas' token)
from service_support import PG, free_port, postgres  # noqa: E402


@contextlib.contextmanager
def serve(tmp: Path, db: str | None) -> Iterator[str]:
    port = free_port()
    (tmp / "token").write_text(TOKEN)
    args = [str(Path(sys.executable).parent / "eroica"), "serve", "--data", str(tmp / "data"), "--port", str(port),
            "--token-file", str(tmp / "token"), "--grace-seconds", "600", "--max-body-bytes", str(64 << 20)]
    p = subprocess.Popen(args + (["--db", db] if db else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(url + "/healthz", timeout=1).read()
                break
            if p.poll() is not None:
                raise SystemExit("eroica serve did not start")
            time.sleep(0.2)
        yield url
    finally:
        p.terminate()
        p.wait(30)


def post(url: str, job: str, body: bytes) -> None:
    req = urllib.request.Request(url + "/v1/patterns", data=gzip.compress(body, 1), method="POST", headers={
        "Authorization": f"Bearer {TOKEN}", "X-Eroica-Job": job, "Content-Encoding": "gzip",
        "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=120).read()


def wait_done(url: str, job: str, timeout: float = 1800) -> dict:  # type: ignore[type-arg]
    t0 = time.time()
    while time.time() - t0 < timeout:
        w = json.loads(urllib.request.urlopen(f"{url}/v1/jobs/{job}", timeout=30).read())["windows"]
        if w and all(x["status"] in ("done", "failed") for x in w):
            return dict(w[-1])
        time.sleep(0.1)
    raise SystemExit(f"{job}: not diagnosed in {timeout} s")


def window_docs(inc: Path) -> list[bytes]:
    wdir = sorted(p for p in (inc / "patterns").iterdir() if p.is_dir())[0]
    files = sorted(wdir.glob("rank-*.json"))
    return [f.read_bytes() for f in files] or [ln for p in sorted(wdir.glob("pack-*.jsonl"))
                                                for ln in p.read_bytes().splitlines() if ln.strip()]


def time_to_diagnosis(k: int) -> list[float]:
    incs = [p for p in sorted((ROOT / "incidents").glob("INC-*")) if (p / "patterns").is_dir()][:k]
    out = []
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp), None) as url:
        for inc in incs:
            docs = window_docs(inc)
            for d in docs:
                post(url, inc.name, d)
            t_last = time.time()
            w = wait_done(url, inc.name)
            out.append(time.time() - t_last if w["diagnosed_at"] is None else max(0.0, w["diagnosed_at"] - t_last))
    return out


class Client(threading.local):
    """One kept-alive HTTP connection per load-generator thread (as a host's sink, or a proxy in front
    of a fleet's, would keep one)."""

    conn: http.client.HTTPConnection | None = None

    def post(self, url: str, job: str, gz: bytes, ctype: str) -> None:
        u = urllib.parse.urlsplit(url)
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
            try:
                self.conn.request("POST", "/v1/patterns", body=gz, headers={
                    "Authorization": f"Bearer {TOKEN}", "X-Eroica-Job": job, "Content-Encoding": "gzip",
                    "Content-Type": ctype})
                r = self.conn.getresponse()
                r.read()
                if r.status >= 300:
                    raise SystemExit(f"POST /v1/patterns: HTTP {r.status}")
                return
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise


def simulated(tmp: Path, ranks: int) -> list[bytes]:
    """The simulated window's host files (8 ranks each), one document per line."""
    from eroica.lab.simulate import simulate

    sim = tmp / "sim"
    simulate(sim, ranks, "gpu_throttled", seed=1, tp=8, pp=5, packed=True)
    return [f.read_bytes() for f in sorted(sim.rglob("host-*.jsonl"))]


def scale(hosts: list[bytes], db: str, batched: bool, replicas: int, tmp: Path,
          processes: int = 1) -> dict[str, object]:
    """Upload one window (8 concurrent clients, spread over the replicas, each with `processes` HTTP
    processes): one document per request, or one host's ranks per request; documents/s, first upload
    to stored diagnosis, peak memory."""
    from load_support import Replica
    reps = [Replica(tmp, db, f"r{i}", extra=["--max-body-bytes", str(64 << 20), "--diagnosis-timeout-seconds",
                                              "1200", "--http-processes", str(processes)]).start()
            for i in range(replicas)]
    try:
        items = hosts if batched else [ln for h in hosts for ln in h.splitlines() if ln.strip()]
        n_docs = sum(h.count(b"\n") for h in hosts)
        # compressed before the clock starts: each host compresses its own upload, on its own CPU
        bodies = [gzip.compress(x, 1) for x in items]
        ctype = "application/x-ndjson" if batched else "application/json"
        client = Client()
        cpu0 = time.process_time()
        t0 = time.time()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda ix: client.post(reps[ix[0] % replicas].url, "sim", ix[1], ctype), enumerate(bodies)))
        t_up = time.time() - t0
        client_ms = (time.process_time() - cpu0) / n_docs * 1e3
        w = wait_done(reps[0].url, "sim", timeout=3600)
        t_all = (w["diagnosed_at"] or time.time()) - t0
        return {"documents": n_docs, "requests": len(items), "upload_s": round(t_up, 1),
                "docs_per_s": round(n_docs / t_up), "to_diagnosis_s": round(t_all, 1),
                "after_upload_s": round(t_all - t_up, 1), "status": w["status"],
                "diagnoses_stored": w["diagnoses_stored"], "error": w["error"],
                "peak_rss_mb": [round(r.peak_rss_bytes / 2**20) for r in reps], "client_ms": round(client_ms, 3)}
    finally:
        for r in reps:
            r.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=10_000, help="the window of the one-by-one and batched comparison")
    ap.add_argument("--fleet-ranks", type=int, default=100_000, help="the fleet window, as host batches on "
                    "PostgreSQL with two replicas (0: skip)")
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--http-processes", type=int, default=2, help="HTTP processes per replica beside the one-process "
                    "runs, and in the fleet run (serve --http-processes)")
    args = ap.parse_args()
    if args.windows:
        ttd = sorted(time_to_diagnosis(args.windows))
        p = lambda q: ttd[min(len(ttd) - 1, int(q * len(ttd)))]  # noqa: E731
        print(f"time to diagnosis over {len(ttd)} recorded 4-rank windows (last document acknowledged -> diagnosis "
              f"stored): p50 {statistics.median(ttd):.2f} s, p95 {p(0.95):.2f} s, max {ttd[-1]:.2f} s", flush=True)

    def show(name: str, r: dict[str, object]) -> None:
        print(f"{name}: {r['documents']} rank documents in {r['requests']} requests, uploaded in {r['upload_s']} s "
              f"({r['docs_per_s']} documents/s); diagnosis stored {r['to_diagnosis_s']} s after the first upload, "
              f"{r['after_upload_s']} s after the last "
              f"({r['status']}, stored {r['diagnoses_stored']}x{', ' + str(r['error']) if r['error'] else ''}); "
              f"peak RSS per replica {r['peak_rss_mb']} MB; the load generator's CPU {r['client_ms']} ms a document",
              flush=True)

    # one rank per request (before batching), one host per request in one process, and in N processes
    ways = [(False, 1), (True, 1), (True, args.http_processes)] if args.http_processes > 1 else [(False, 1), (True, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        hosts = simulated(Path(tmp), args.ranks) if args.ranks else []
        for kind in ("sqlite", "postgresql") if hosts else ():
            if kind == "postgresql" and not PG:
                print("postgresql: skipped (no initdb/pg_ctl)")
                continue
            for batched, procs in ways:
                with tempfile.TemporaryDirectory() as run, (
                        postgres() if kind == "postgresql" else contextlib.nullcontext(f"sqlite:///{run}/e.db")) as db:
                    how = "one host (8 ranks) per request" if batched else "one rank per request"
                    show(f"{kind}, {args.ranks} ranks, {how}, {procs} HTTP process{'es' if procs > 1 else ''}",
                         scale(hosts, db, batched, 1, Path(run), procs))
    if args.fleet_ranks and PG:
        with tempfile.TemporaryDirectory() as tmp:
            hosts = simulated(Path(tmp), args.fleet_ranks)
            with postgres() as db:
                show(f"postgresql, 2 replicas x {args.http_processes} HTTP processes, {args.fleet_ranks} ranks as "
                     f"{len(hosts)} host documents", scale(hosts, db, True, 2, Path(tmp), args.http_processes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
