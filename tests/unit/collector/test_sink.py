"""The collector's HTTP sink against a real HTTP server on 127.0.0.1: it ships gzip'd documents with
the job's id and token, spools what a dead service cannot take and sends it first when the service
is back, drops nothing a refusal would not drop, and never blocks or raises."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from eroica.collector.sink import SERIES_EVERY, PatternSink


class Recorder(BaseHTTPRequestHandler):
    got: list[tuple[str, dict[str, str], bytes]] = []
    status = 201

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.got.append((self.path, dict(self.headers), gzip.decompress(body)))
        self.send_response(Recorder.status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a: object) -> None:
        pass


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _listening(port: int) -> Iterator[ThreadingHTTPServer]:
    """A real HTTP server on 127.0.0.1:port, recording what it gets, for the with block."""
    srv = ThreadingHTTPServer(("127.0.0.1", port), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_documents_arrive_gzipped_with_the_job_and_the_token(tmp_path: Path) -> None:
    Recorder.got, Recorder.status = [], 201
    port = _port()
    with _listening(port):
        sink = PatternSink(f"http://127.0.0.1:{port}", "job-7", tmp_path / "spool", token="tok", job_name="job")
        assert sink.submit('{"schema": "eroica.patterns/v1"}')
        assert sink.submit_steps(0, 19, 0.1, 0.12, 4)
        assert sink.submit_end()
        assert sink.close(10)
        (p1, h1, b1), (p2, _, b2), (p3, _, _) = Recorder.got
        assert p3 == "/v1/jobs/job-7/end"
        assert (p1, h1["X-Eroica-Job"], h1["Authorization"], h1["Content-Encoding"]) == (
            "/v1/patterns", "job-7", "Bearer tok", "gzip")
        assert h1["X-Eroica-Job-Name"] == "job"          # its runs share it: the service follows a restart
        assert json.loads(b1)["schema"] == "eroica.patterns/v1"
        assert p2 == "/v1/jobs/job-7/steps" and json.loads(b2)["world_size"] == 4
        assert sink.messages() == [] and sink.sent == 3


def test_a_dead_service_costs_nothing_and_the_spool_is_sent_when_it_is_back(tmp_path: Path) -> None:
    Recorder.got, Recorder.status = [], 201
    port = _port()                       # nothing listens yet
    sink = PatternSink(f"http://127.0.0.1:{port}", "job", tmp_path / "spool", attempts=2, timeout_seconds=1)
    t0 = time.perf_counter()
    assert sink.submit('{"n": 1}') and sink.submit('{"n": 2}') and sink.submit_end()
    assert time.perf_counter() - t0 < 0.05          # submit never waits for the network
    assert sink.flush(30)
    assert len(list((tmp_path / "spool").glob("*.json.gz"))) == 3
    assert all("spooled" in e for e in sink.messages())
    with _listening(port):
        assert sink.submit('{"n": 3}') and sink.close(30)
        assert sorted(json.loads(ln)["n"] for p, _, b in Recorder.got if p == "/v1/patterns"
                      for ln in b.splitlines()) == [1, 2, 3]
        # the two spooled documents went back as one batch (one per line), before the end, then the third
        (p1, h1, b1) = Recorder.got[0]
        assert (p1, h1["Content-Type"], b1.splitlines()) == ("/v1/patterns", "application/x-ndjson",
                                                             [b'{"n": 1}', b'{"n": 2}'])
        assert [p for p, _, _ in Recorder.got] == ["/v1/patterns", "/v1/jobs/job/end", "/v1/patterns"]
        assert list((tmp_path / "spool").glob("*.json.gz")) == []


def test_a_refusal_is_not_retried_or_spooled_and_says_why(tmp_path: Path) -> None:
    Recorder.got, Recorder.status = [], 422
    port = _port()
    with _listening(port):
        sink = PatternSink(f"http://127.0.0.1:{port}", "job", tmp_path / "spool")
        assert sink.submit('{"bad": true}') and sink.close(10)
        assert len(Recorder.got) == 1 and not (tmp_path / "spool").exists()
        (err,) = sink.messages()
        assert err.startswith("refused:") and "HTTP 422" in err


def test_a_refused_spooled_batch_is_sent_again_one_by_one_and_only_the_bad_one_is_dropped(tmp_path: Path) -> None:
    class Picky(Recorder):
        def do_POST(self) -> None:  # noqa: N802
            body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
            Recorder.got.append((self.path, dict(self.headers), body))
            self.send_response(422 if b"bad" in body else 201)
            self.end_headers()
            self.wfile.write(b"{}")

    Recorder.got = []
    port = _port()
    sink = PatternSink(f"http://127.0.0.1:{port}", "job", tmp_path / "spool", attempts=1, timeout_seconds=1)
    assert sink.submit('{"n": 1}') and sink.submit('{"bad": 2}') and sink.submit('{"n": 3}') and sink.flush(30)
    srv = ThreadingHTTPServer(("127.0.0.1", port), Picky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert sink.submit_end() and sink.close(30)
    finally:
        srv.shutdown()
        srv.server_close()
    bodies = [b for _, _, b in Recorder.got]
    assert bodies[0].count(b"\n") == 3                       # the batch, refused as a whole
    assert bodies[1:4] == [b'{"n": 1}', b'{"bad": 2}', b'{"n": 3}']    # then each alone
    assert sink.sent == 3 and any("HTTP 422" in m for m in sink.messages())
    assert list((tmp_path / "spool").glob("*.json.gz")) == []


def test_a_leaders_batch_goes_in_requests_of_at_most_batch_lines(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from eroica.collector import sink as sink_mod

    monkeypatch.setattr(sink_mod, "BATCH_LINES", 4)
    Recorder.got, Recorder.status = [], 201
    port = _port()
    with _listening(port):
        sink = PatternSink(f"http://127.0.0.1:{port}", "job", tmp_path / "spool")
        assert sink.submit_batch("".join(f'{{"n": {i}}}\n' for i in range(10))) and sink.close(10)
    assert [len(b.splitlines()) for _, _, b in Recorder.got] == [4, 4, 2]
    assert {h["Content-Type"] for _, h, _ in Recorder.got} == {"application/x-ndjson"} and sink.sent == 3


def test_the_sinks_job_id_is_one_per_run_and_never_a_shared_placeholder(tmp_path: Path) -> None:
    from eroica.collector.monitor import sink_job_id, sink_job_name

    assert sink_job_id("", tmp_path / "job-sink") == "job-sink"
    assert sink_job_id("none", tmp_path / "run-1") == "run-1"             # torchrun's static run id
    assert sink_job_id("llm-7b", tmp_path / "run-2") == "llm-7b.run-2"    # a restart gets a new run dir
    assert sink_job_id("a b/c", tmp_path / "r") == "a-b-c.r"
    assert len(sink_job_id("x" * 300, tmp_path / "r")) <= 128
    assert (sink_job_name("llm-7b"), sink_job_name("none"), sink_job_name(""), sink_job_name("a b")) == (
        "llm-7b", None, None, "a-b")


def test_rank_0s_step_times_go_out_as_one_summary_per_series_every_steps(tmp_path: Path) -> None:
    Recorder.got, Recorder.status = [], 201
    port = _port()
    with _listening(port):
        sink = PatternSink(f"http://127.0.0.1:{port}", "job-7", tmp_path / "spool")
        for step in range(3, 3 + 2 * SERIES_EVERY + 5):          # two whole summaries, five steps pending
            sink.step_seen(step, 0.1 + (step % 10) / 100, 4)
        assert sink.close(10)
        bodies = [json.loads(b) for p, _, b in Recorder.got if p == "/v1/jobs/job-7/steps"]
        want = []
        for first in (3, 3 + SERIES_EVERY):
            xs = sorted(0.1 + (s % 10) / 100 for s in range(first, first + SERIES_EVERY))
            want.append({"first_step": first, "last_step": first + SERIES_EVERY - 1,
                         "median_seconds": xs[SERIES_EVERY // 2], "p90_seconds": xs[int(0.9 * SERIES_EVERY)],
                         "world_size": 4})
        assert bodies == want


class Redirector(BaseHTTPRequestHandler):
    """Answers every POST with a 302 to another host, and records what follows it there."""

    got: list[tuple[str, str, dict[str, str]]] = []
    target = ""

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(302)
        self.send_header("Location", Redirector.target + "/stolen")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        Redirector.got.append(("GET", self.path, dict(self.headers)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a: object) -> None:
        pass


def test_a_redirect_is_never_followed_the_token_stays_and_the_document_is_kept(tmp_path: Path) -> None:
    Redirector.got = []
    port, other = _port(), _port()
    srv = ThreadingHTTPServer(("127.0.0.1", port), Redirector)
    elsewhere = ThreadingHTTPServer(("127.0.0.1", other), Redirector)
    Redirector.target = f"http://127.0.0.1:{other}"
    for s in (srv, elsewhere):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        sink = PatternSink(f"http://127.0.0.1:{port}", "job", tmp_path / "spool", token="secret-token")
        assert sink.submit('{"n": 1}') and sink.close(10)
        assert Redirector.got == []                              # before: a GET to /stolen with the bearer token
        (err,) = sink.messages()
        assert "redirected" in err and "HTTP 302" in err and sink.sent == 0
        assert [f.name.split("-")[-1] for f in (tmp_path / "spool").glob("*.json.gz")] == ["patterns.json.gz"]
    finally:
        for s in (srv, elsewhere):
            s.shutdown()
            s.server_close()


def test_the_spool_replays_each_kind_to_its_route_in_the_order_it_was_made(tmp_path: Path) -> None:
    Recorder.got, Recorder.status = [], 201
    port = _port()                                      # down: everything is spooled
    sink = PatternSink(f"http://127.0.0.1:{port}", "job-7", tmp_path / "spool", attempts=1, timeout_seconds=1,
                       job_name="llm")
    assert sink.submit('{"n": 1}') and sink.submit_hang('{"hang": 1}') and sink.submit('{"n": 2}')
    assert sink.flush(30)
    meta = json.loads((tmp_path / "spool" / "meta.json").read_text())
    assert (meta["job_id"], meta["job_name"]) == ("job-7", "llm")
    with _listening(port):
        assert sink.submit_end() and sink.close(30)     # the job ends: its last word goes after the rest
    paths = [(p, json.loads(b) if p != "/v1/jobs/job-7/end" else None) for p, _, b in Recorder.got]
    assert paths == [("/v1/patterns", {"n": 1}), ("/v1/jobs/job-7/hang", {"hang": 1}), ("/v1/patterns", {"n": 2}),
                     ("/v1/jobs/job-7/end", None)]
    assert list((tmp_path / "spool").glob("*.json.gz")) == []


def test_eroica_ingest_spool_sends_what_a_job_left_behind_after_it_exited(tmp_path: Path) -> None:
    import subprocess
    import sys

    Recorder.got, Recorder.status = [], 201
    port = _port()
    run = tmp_path / "run-1"
    sink = PatternSink(f"http://127.0.0.1:{port}", "run-1", run / ".spool" / "rank-0", attempts=1, timeout_seconds=1)
    assert sink.submit('{"n": 1}') and sink.submit_steps(0, 19, 0.1, 0.12, 4) and sink.submit_end()
    assert sink.close(30)                                # the job exits with its spool full
    eroica = str(Path(sys.executable).parent / "eroica")
    # the spool's meta.json names where it was going; the token is sent only where the operator says
    meta = json.loads((run / ".spool" / "rank-0" / "meta.json").read_text())
    assert meta["url"] == f"http://127.0.0.1:{port}"
    (run / ".spool" / "rank-0" / "meta.json").write_text(json.dumps({**meta, "url": "http://attacker.example:80"}))
    env = {k: v for k, v in os.environ.items() if k != "EROICA_SINK"}
    r = subprocess.run([eroica, "ingest", "spool", str(run)], capture_output=True, text=True, timeout=120,
                       env={**env, "EROICA_SINK_TOKEN": "secret-token"})
    assert r.returncode == 2 and "give --server URL" in r.stdout and "attacker.example" in r.stdout, r.stdout
    with _listening(port):
        r = subprocess.run([eroica, "ingest", "spool", str(run), "--server", f"http://127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p for p, _, _ in Recorder.got] == ["/v1/patterns", "/v1/jobs/run-1/steps", "/v1/jobs/run-1/end"]
    assert "3 sent, 0 refused" in r.stdout and list((run / ".spool" / "rank-0").glob("*.json.gz")) == []
