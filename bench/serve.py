"""eroica serve, measured: time to diagnosis and ingestion at scale, through the real HTTP API.

1. Time to diagnosis: the library's recorded 4-rank windows (incidents/INC-*) are uploaded one
   window at a time to a live `eroica serve` (SQLite); for each, the time from the last rank's
   document being acknowledged to the diagnosis being stored (p50, p95, max). The collector's own
   part (window close to the document's arrival) is the sink's POST, milliseconds on a LAN.
2. Scale: a simulated N-rank window (eroica.lab.simulate, gpu_throttled; N=10000 by default) is
   uploaded through the API with 8 concurrent clients; documents/s and wall time from the first
   upload to the stored diagnosis, on SQLite and (where initdb/pg_ctl exist) PostgreSQL side by side.

Usage: python bench/serve.py [--ranks N] [--windows K]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from service_support import PG, free_port, postgres  # noqa: E402

TOKEN = "bench"


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
        "Authorization": f"Bearer {TOKEN}", "X-Eroica-Job": job, "Content-Encoding": "gzip"})
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


def scale(ranks: int, db: str | None) -> dict[str, float]:
    from eroica.lab.simulate import simulate

    with tempfile.TemporaryDirectory() as tmp:
        sim = Path(tmp) / "sim"
        simulate(sim, ranks, "gpu_throttled", seed=1, tp=8, pp=5, packed=True)
        docs = [ln for f in sorted(sim.rglob("*.jsonl")) for ln in f.read_bytes().splitlines() if ln.strip()]
        with serve(Path(tmp), db) as url:
            t0 = time.time()
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda d: post(url, "sim", d), docs))
            t_up = time.time() - t0
            w = wait_done(url, "sim")
            t_all = time.time() - t0
        return {"documents": len(docs), "upload_s": round(t_up, 1), "docs_per_s": round(len(docs) / t_up),
                "to_diagnosis_s": round(t_all, 1), "status": w["status"]}  # type: ignore[dict-item]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=10_000)
    ap.add_argument("--windows", type=int, default=20)
    args = ap.parse_args()
    ttd = sorted(time_to_diagnosis(args.windows))
    p = lambda q: ttd[min(len(ttd) - 1, int(q * len(ttd)))]  # noqa: E731
    print(f"time to diagnosis over {len(ttd)} recorded 4-rank windows (last document acknowledged -> diagnosis "
          f"stored): p50 {statistics.median(ttd):.2f} s, p95 {p(0.95):.2f} s, max {ttd[-1]:.2f} s")
    for name, ctx in (("sqlite", contextlib.nullcontext(None)), ("postgresql", postgres() if PG else None)):
        if ctx is None:
            print(f"{name}: skipped (no initdb/pg_ctl)")
            continue
        with ctx as db:
            r = scale(args.ranks, db)
        print(f"{name}: {args.ranks} ranks, {r['documents']} documents uploaded in {r['upload_s']} s "
              f"({r['docs_per_s']} documents/s), diagnosis stored {r['to_diagnosis_s']} s after the first upload "
              f"({r['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
