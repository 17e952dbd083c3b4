"""What the service tests share: the token, and real pattern documents of the incident library."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).parents[1]
TOKEN = "t0ken-for-tests"
LOCAL = "http://127.0.0.1:8080"        # TestClient's base URL: a Host the service answers to
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def incident_docs(inc: str = "INC-0017") -> list[bytes]:
    """The rank documents of an incident's first window, as the collector wrote them."""
    wdir = sorted(p for p in (ROOT / "incidents" / inc / "patterns").iterdir() if p.is_dir())[0]
    files = sorted(wdir.glob("rank-*.json"))
    if files:
        return [f.read_bytes() for f in files]
    return [ln for p in sorted(wdir.glob("pack-*.jsonl")) for ln in p.read_bytes().splitlines() if ln.strip()]


def window_docs(inc: str, index: int) -> list[bytes]:
    """An incident's first window as the `index`-th window of a job (its id and steps moved on), gzip'd as the
    sink sends each document."""
    out = []
    for d in incident_docs(inc):
        doc = json.loads(d)
        w = doc["window"]
        span = w["end_step"] - w["start_step"]
        w.update(window_id=f"w{index:03d}-s{30 + 40 * index}", start_step=30 + 40 * index,
                 end_step=30 + 40 * index + span)
        out.append(gzip.compress(json.dumps(doc).encode()))
    return out


#: frames of a hang snapshot: a rank waiting in the backward's all-reduce, and one stuck in its loader's collate
TORCH_WAIT = {"file": "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", "line": 979,
              "function": "_engine_run_backward", "code": ""}
BACKWARD = {"file": "/job/train.py", "line": 40, "function": "main", "code": "loss.backward()"}
LOADER = [{"file": "/job/data.py", "line": 12, "function": "collate", "code": "ev.wait()"},
          {"file": "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "line": 700,
           "function": "__next__", "code": ""}]


def stop(p: subprocess.Popen, seconds: float = 20) -> None:  # type: ignore[type-arg]
    """A server process the test started: asked to stop, then killed."""
    p.terminate()
    try:
        p.wait(seconds)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def changed_doc(inc: str = "INC-0017", **change: object) -> bytes:
    """Rank 0's document of an incident's first window with fields changed (`window__start_step=5`)."""
    d = json.loads(incident_docs(inc)[0])
    for k, v in change.items():
        obj = d
        *path, last = k.split("__")
        for p in path:
            obj = obj[p]
        obj[last] = v
    return json.dumps(d).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(cands[-1]) if cands else None


PG = pg_bin("initdb") and pg_bin("pg_ctl")
PG_WHY = "PostgreSQL server binaries (initdb, pg_ctl) are not installed (.ci/run installs Debian's postgresql)"


class PgCluster:
    """A throwaway PostgreSQL cluster in a temporary directory, on a free port; it can be stopped and
    started again (a database outage)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="eroica-pg-", dir="/tmp"))
        self.as_pg: list[str] = []
        if os.geteuid() == 0:     # initdb refuses to run as root
            shutil.chown(self.dir, "postgres")
            self.as_pg = ["runuser", "-u", "postgres", "--"]
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/eroica"

    def _ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run([*self.as_pg, str(pg_bin("pg_ctl")), "-D", str(self.dir / "data"), *args], check=check,
                       capture_output=True)

    def create(self) -> PgCluster:
        subprocess.run([*self.as_pg, str(pg_bin("initdb")), "-D", str(self.dir / "data"), "--auth=trust", "-U",
                        "postgres"], check=True, capture_output=True)
        self.start()
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE eroica")
        return self

    def start(self) -> None:
        self._ctl("-l", str(self.dir / "log"), "-w", "start", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    pg = PgCluster()
    try:
        yield pg.create()
    finally:
        pg.remove()


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster's database URL, removed afterwards."""
    with pg_cluster() as pg:
        yield pg.url


@contextlib.contextmanager
def database(kind: str, tmp: Path) -> Iterator[str]:
    """A database URL of `kind` (sqlite: a file in `tmp`; postgresql: a throwaway cluster)."""
    if kind == "postgresql":
        with postgres() as url:
            yield url
    else:
        yield f"sqlite:///{tmp / 'shared.db'}"


SERVE_TOKEN = "e2e-token"


@contextlib.contextmanager
def serve(tmp: Path, *args: str, host: str = "127.0.0.1") -> Iterator[str]:
    """`eroica serve` as a user runs it, until the block ends (on `host`: another address than the
    loopback one, e.g. a simulated hosts' bridge)."""
    port = free_port()
    (tmp / "token").write_text(SERVE_TOKEN)
    eroica = Path(sys.executable).parent / "eroica"
    log = (tmp / "serve.log").open("w")
    p = subprocess.Popen([str(eroica), "serve", "--data", str(tmp / "data"), "--port", str(port), "--token-file",
                          str(tmp / "token"), "--grace-seconds", "10", "--host", host, *args], stdout=log,
                         stderr=subprocess.STDOUT)
    url = f"http://{host}:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).read()
                break
            except OSError:
                if p.poll() is not None or time.time() > deadline:
                    raise AssertionError("eroica serve did not start:\n" + (tmp / "serve.log").read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        stop(p)
        log.close()


def get(url: str) -> object:
    return json.loads(urllib.request.urlopen(url, timeout=5).read())


class Receiver:
    """An HTTP receiver on 127.0.0.1 that records what it is sent at `path`: by default the
    Alertmanager v2 `POST /api/v2/alerts` route; a webhook's or a Slack incoming webhook's path else."""

    def __init__(self, delay: float = 0.0, path: str = "/api/v2/alerts") -> None:
        self.got: list[list[dict]] = []  # type: ignore[type-arg]
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)
                if self.path != path:
                    self.send_response(404)
                    self.end_headers()
                    return
                outer.got.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.port = free_port()
        self.srv = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
