"""The service against hostile input and hostile pages, each a request that broke it before:
a window id that is a path, well-formed documents whose numbers overflow a column or whose JSON is
20,000 deep, a hang snapshot of the wrong types or the wrong world, a chunked body past the limit,
a web page posting a form or text/plain, a rebound DNS name, a job token renaming its run into
another job, a slow upload and a locked database while /healthz must still answer."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from service_support import AUTH, LOCAL, TOKEN, changed_doc, free_port, incident_docs

from eroica.service.app import Settings, create_app

HANG = {"schema": "eroica.hang/v1", "rank": 0, "world_size": 4, "wall_time": 1000.0, "host": "node-1",
        "last_step": 30, "stalled_seconds": 5.0, "limit_seconds": 4.0, "stack": [], "seq": 9,
        "last_entered": None, "last_completed": None, "error": None, "nics": {}, "peers": {}}


doc = changed_doc


def deep(n: int) -> bytes:
    return b'{"schema": "eroica.patterns/v1", "job": ' + b"[" * n + b"]" * n + b"}"


def nothing_stored(c: TestClient) -> None:
    assert c.get("/v1/jobs").json() == []
    assert c.get("/v1/issues").json() == []


HOSTILE_DOCS = [
    # (what, body, status, field)
    ("a window id that is a path", doc(window__window_id="/tmp/x"), 422, "window.window_id"),
    ("a window id that climbs", doc(window__window_id="../../etc/w1-s1"), 422, "window.window_id"),
    ("a world of 10**20", doc(job__world_size=10**20), 422, "job.world_size"),
    ("a start step of 2**63", doc(window__start_step=2**63), 422, "window.start_step"),
    ("a pid of 2**70", doc(job__pid=2**70), 422, "job.pid"),
    ("a host name of 10,000 characters", doc(job__hostname="h" * 10_000), 422, "job.hostname"),
    ("JSON 20,000 deep", deep(20_000), 400, "body"),
    ("JSON 20,000 deep, in a field", doc(config=json.loads("[" * 200 + "]" * 200)), 422, "config.0"),
]


@pytest.mark.parametrize(("what", "body", "status", "field"), HOSTILE_DOCS, ids=[h[0] for h in HOSTILE_DOCS])
def test_a_hostile_pattern_document_is_a_4xx_naming_its_field_never_a_500(
        client: TestClient, what: str, body: bytes, status: int, field: str) -> None:
    r = client.post("/v1/patterns", content=gzip.compress(body),
                    headers={**AUTH, "X-Eroica-Job": "job-1", "Content-Encoding": "gzip"})
    assert (r.status_code, r.json()["field"]) == (status, field), r.text
    nothing_stored(client)


def test_the_worker_never_builds_a_path_from_a_window_id(tmp_path: Path) -> None:
    """Even an id that slipped past ingest: the worker names its directories itself."""
    from eroica.service.worker import diagnose_window

    target = tmp_path / "escaped"
    out = json.loads(diagnose_window(str(target), incident_docs("INC-0017"), None, [], []))
    assert out["windows"][0]["window"] == str(target) and not target.exists()


HOSTILE_HANGS = [
    ("not JSON", b"{", 400, "body"),
    ("JSON 20,000 deep", b'{"schema": "eroica.hang/v1", "stack": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
     400, "body"),
    ("a rank that is a string", json.dumps({**HANG, "rank": "zero"}).encode(), 422, "rank"),
    ("a stack of numbers", json.dumps({**HANG, "stack": [1, 2, 3]}).encode(), 422, "stack.0"),
    ("a frame without a file", json.dumps({**HANG, "stack": [{"line": 3, "function": "f"}]}).encode(), 422,
     "stack.0.file"),
    ("peers as a list", json.dumps({**HANG, "peers": [1]}).encode(), 422, "peers"),
    ("a seq of 2**70", json.dumps({**HANG, "seq": 2**70}).encode(), 422, "seq"),
    ("a world of 10**20", json.dumps({**HANG, "world_size": 10**20}).encode(), 422, "world_size"),
    ("a rank outside its world", json.dumps({**HANG, "rank": 4}).encode(), 422, "body"),
    ("a last step of 2**63", json.dumps({**HANG, "last_step": 2**63}).encode(), 422, "last_step"),
    ("a wall time of 1e308", json.dumps({**HANG, "wall_time": 1e308}).encode(), 422, "wall_time"),
]


@pytest.mark.parametrize(("what", "body", "status", "field"), HOSTILE_HANGS, ids=[h[0] for h in HOSTILE_HANGS])
def test_a_hostile_hang_snapshot_is_a_4xx_naming_its_field(client: TestClient, what: str, body: bytes, status: int,
                                                           field: str) -> None:
    r = client.post("/v1/jobs/job-h/hang", content=body, headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (status, field), r.text
    nothing_stored(client)


def test_a_hang_snapshot_of_another_world_than_its_jobs_is_refused(client: TestClient) -> None:
    for d in incident_docs("INC-0017"):                        # a job of 4
        assert client.post("/v1/patterns", content=d, headers={**AUTH, "X-Eroica-Job": "job-4"}).status_code == 201
    r = client.post("/v1/jobs/job-4/hang", content=json.dumps({**HANG, "world_size": 2}).encode(), headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (422, "world_size")
    assert client.get("/v1/jobs/job-4/hang").status_code == 404


@pytest.mark.parametrize("body", [{"first_step": 0, "last_step": 2**63, "median_seconds": 0.1, "p90_seconds": 0.1,
                                   "world_size": 4},
                                  {"first_step": 9, "last_step": 3, "median_seconds": 0.1, "p90_seconds": 0.1,
                                   "world_size": 4},
                                  {"first_step": 0, "last_step": 3, "median_seconds": 0.1, "p90_seconds": 0.1,
                                   "world_size": 10**20}])
def test_a_hostile_step_summary_is_refused(client: TestClient, body: dict[str, Any]) -> None:
    r = client.post("/v1/jobs/job-s/steps", content=json.dumps(body).encode(), headers=AUTH)
    assert r.status_code == 422 and r.json()["field"], r.text
    nothing_stored(client)


@pytest.mark.parametrize("path", ["/v1/windows/9223372036854775808", "/v1/windows/0/diagnosis",
                                  "/v1/issues/99999999999999999999/incident", "/v1/findings?min_confidence=nan",
                                  "/v1/findings?limit=100000000000000000000", "/v1/summary?days=1e308",
                                  "/v1/drain?format=xml"])
def test_a_hostile_path_or_query_is_a_4xx(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (404, 422), (path, r.status_code, r.text)
    assert r.json()["field"]


# ---------------------------------------------------------------- pages and browsers
def test_a_web_page_cannot_write_with_no_token_configured(tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'o.db'}", grace_seconds=1, poll_seconds=0.1))
    with TestClient(app, base_url=LOCAL) as c:
        body = incident_docs("INC-0017")[0]
        evil = {"Origin": "https://evil.example", "X-Eroica-Job": "job"}
        r = c.post("/v1/patterns", content=body, headers=evil)                       # fetch() from evil's page
        assert (r.status_code, r.json()["field"]) == (403, "origin")
        r = c.post("/v1/patterns", content=body, headers={"Content-Type": "text/plain", "X-Eroica-Job": "job"})
        assert (r.status_code, r.json()["field"]) == (415, "content-type")          # a simple request: no preflight
        r = c.post("/issues/1/act", data={"action": "false_positive", "who": "x", "why": "y"},
                   headers={"Origin": "https://evil.example"})                       # an HTML form on evil's page
        assert (r.status_code, r.json()["field"]) == (403, "origin")
        r = c.post("/issues/1/act", data={"action": "ack", "who": "x"}, headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        r = c.post("/v1/issues/1/ack", content=b'{"who": "x"}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        nothing_stored(c)
        # its own pages still work: same origin
        r = c.post("/v1/patterns", content=body, headers={"Origin": LOCAL, "X-Eroica-Job": "job",
                                                           "Content-Type": "application/json"})
        assert r.status_code == 201


def test_a_rebound_dns_name_is_refused(tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'h.db'}"), start=False)
    with TestClient(app, base_url="http://attacker.example:8080") as c:
        r = c.get("/v1/jobs")
        assert (r.status_code, r.json()["field"]) == (421, "host")
    with TestClient(app, base_url="http://localhost:8080") as c:
        assert c.get("/v1/jobs").status_code == 200
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'h.db'}", allowed_hosts=["eroica.corp"]), start=False)
    with TestClient(app, base_url="http://eroica.corp") as c:
        assert c.get("/v1/jobs").status_code == 200


def test_with_a_read_token_people_sign_in_once_and_the_forms_work(tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}", token=TOKEN, read_token=True,
                              grace_seconds=1, poll_seconds=0.1))
    with TestClient(app, base_url=LOCAL) as c:
        r = c.get("/jobs/x", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/login?next=/jobs/x")
        assert c.get("/v1/jobs").status_code == 401                                 # the API says 401
        r = c.post("/login", data={"token": "wrong", "next": "/"}, follow_redirects=False)
        assert r.status_code == 401 and "not the service" in r.text and "eroica_session" not in r.headers.get(
            "set-cookie", "")
        r = c.post("/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"                 # never off-site
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert c.get("/").status_code == 200                                         # the session reads
        assert c.get("/v1/jobs").status_code == 200
        r = c.post("/v1/patterns", content=incident_docs("INC-0017")[0], headers={"X-Eroica-Job": "j"})
        assert r.status_code == 401                                                  # not the API's writes
        for d in incident_docs("INC-0017"):
            assert c.post("/v1/patterns", content=d, headers={**AUTH, "X-Eroica-Job": "job-r"}).status_code == 201
        deadline = time.time() + 60
        while not c.get("/v1/issues", params={"job": "job-r"}).json() and time.time() < deadline:
            time.sleep(0.2)
        (issue,) = c.get("/v1/issues", params={"job": "job-r"}).json()
        assert 'type="password"' not in c.get("/jobs/job-r").text                   # signed in: no token field
        r = c.post(f"/issues/{issue['id']}/act", data={"action": "ack", "who": "alice", "back": "/jobs/job-r"},
                   follow_redirects=False)
        assert r.status_code == 303
        assert c.get("/v1/issues", params={"job": "job-r"}).json()[0]["state"] == "acknowledged"
    with pytest.raises(ValueError, match="read_token needs a token"):
        Settings(db_url="sqlite://", read_token=True)


def test_a_job_token_writes_only_its_own_jobs_and_no_run_changes_its_name(tmp_path: Path) -> None:
    team_a = "team-a-token-0123456789"
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'j.db'}", token=TOKEN, job_tokens={team_a: "team-a-*"}),
                     start=False)
    with TestClient(app, base_url=LOCAL) as c:
        a = {"Authorization": f"Bearer {team_a}"}
        d0, d1 = incident_docs("INC-0017")[:2]
        assert c.post("/v1/patterns", content=d0, headers={**AUTH, "X-Eroica-Job": "run-b",
                                                          "X-Eroica-Job-Name": "team-b-llm"}).status_code == 201
        # team a's token, into team b's run: by its run id, then renaming it
        r = c.post("/v1/patterns", content=d1, headers={**a, "X-Eroica-Job": "run-b"})
        assert (r.status_code, r.json()["field"]) == (403, "authorization")
        r = c.post("/v1/patterns", content=d1, headers={**a, "X-Eroica-Job": "run-b", "X-Eroica-Job-Name": "team-a-x"})
        assert (r.status_code, r.json()["field"]) == (403, "authorization")         # the run is team b's
        # even the service's token cannot rename a named run
        r = c.post("/v1/patterns", content=d1, headers={**AUTH, "X-Eroica-Job": "run-b",
                                                       "X-Eroica-Job-Name": "team-c"})
        assert (r.status_code, r.json()["field"]) == (409, "x-eroica-job-name")
        r = c.post("/v1/jobs/run-b/end", content=b"{}", headers=a)
        assert r.status_code == 403
        # its own jobs (the sink's id is `<name>.<run>`): yes; the issues' API: no
        assert c.post("/v1/patterns", content=d1, headers={**a, "X-Eroica-Job": "team-a-llm.run-a",
                                                          "X-Eroica-Job-Name": "team-a-llm"}).status_code == 201
        assert c.post("/v1/issues/1/ack", content=b'{"who": "a"}', headers=a).status_code == 403
        (b,) = [j for j in c.get("/v1/jobs").json() if j["id"] == "run-b"]
        assert (b["name"], b["ended_at"]) == ("team-b-llm", None)


def test_a_job_token_cannot_take_another_teams_run_id_and_a_run_is_bound_to_its_creator(tmp_path: Path) -> None:
    """Team a's token posting to `team-b.<run>` under its own name was taken (201), and team b's own token was
    then refused on its own run, the 403 naming the wrong job; and two tokens whose scopes overlap could write
    each other's runs."""
    team_a, team_b, ops = "team-a-token-0123456789", "team-b-token-0123456789", "ops-token-0123456789ab"
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'j.db'}", token=TOKEN,
                              job_tokens={team_a: "team-a*", team_b: "team-b*", ops: "team-*"}), start=False)
    with TestClient(app, base_url=LOCAL) as c:
        d0, d1 = incident_docs("INC-0017")[:2]

        def post(tok: str, job: str, name: str, doc: bytes = d0) -> Any:
            return c.post("/v1/patterns", content=doc, headers={"Authorization": f"Bearer {tok}", "X-Eroica-Job": job,
                                                                 "X-Eroica-Job-Name": name})

        r = post(team_a, "team-b.run-1", "team-a")
        assert r.status_code == 403 and "'team-b.run-1'" in r.json()["error"] and "its id" in r.json()["error"]
        assert post(team_b, "team-b.run-1", "team-b").status_code == 201          # team b's own run is its own
        r = post(ops, "team-b.run-1", "team-b", d1)                               # in scope, but not its run
        assert r.status_code == 403 and "created by a writer of another scope" in r.json()["error"], r.json()
        assert post(team_b, "team-b.run-1", "team-b", d1).status_code == 201
        assert c.post("/v1/patterns", content=d1, headers={**AUTH, "X-Eroica-Job": "team-b.run-1",     # stored once
                                                            "X-Eroica-Job-Name": "team-b"}).status_code == 200


def test_serve_refuses_to_listen_open_beyond_the_machine_or_to_open_reads_silently(tmp_path: Path) -> None:
    import subprocess
    import sys

    eroica = str(Path(sys.executable).parent / "eroica")
    base = [eroica, "serve", "--data", str(tmp_path), "--port", str(free_port())]
    r = subprocess.run([*base, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--insecure-no-token" in r.stderr
    r = subprocess.run([*base, "--read-token"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--read-token needs --token-file" in r.stderr


# ---------------------------------------------------------------- bodies on a real socket
@contextlib.contextmanager
def live(tmp: Path, **kw: Any) -> Iterator[int]:
    port = free_port()
    app = create_app(Settings(db_url=f"sqlite:///{tmp / 'live.db'}", grace_seconds=1, poll_seconds=0.1, **kw))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        t.join(10)


def chunked_until_answered(port: int, headers: str, total: int) -> tuple[int, bytes]:
    """Send a chunked body of up to `total` bytes in 64 KB chunks, reading between them; how many
    bytes went out before the service answered, and its answer."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"POST /v1/patterns HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\n"
              f"X-Eroica-Job: j\r\n{headers}\r\n".encode())
    s.settimeout(0.05)
    chunk, sent, resp = b"x" * 65536, 0, b""
    try:
        while sent < total and not resp:
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
            with contextlib.suppress(socket.timeout):
                resp += s.recv(4096)
        s.settimeout(5)
        while not resp:
            resp += s.recv(4096)
    except OSError:          # the service closed the connection on the rest of the body
        pass
    finally:
        s.close()
    return sent, resp


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit_even_with_no_token(tmp_path: Path) -> None:
    with live(tmp_path, max_body_bytes=100_000) as port:
        sent, resp = chunked_until_answered(port, "", 2_000_000)
    assert resp.startswith(b"HTTP/1.1 413"), resp[:100]
    assert sent <= 4 * 65536, sent                     # answered at the limit, not after 2 MB


def test_a_chunked_body_without_the_token_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with live(tmp_path, token=TOKEN) as port:
        sent, resp = chunked_until_answered(port, "", 2_000_000)
    assert resp.startswith(b"HTTP/1.1 401"), resp[:100]
    assert sent <= 4 * 65536, sent


def test_a_slow_upload_and_a_locked_database_do_not_stall_health_or_reads(tmp_path: Path) -> None:
    with live(tmp_path, token=TOKEN) as port:
        base = f"http://127.0.0.1:{port}"
        import urllib.request

        def health_seconds() -> float:
            t0 = time.perf_counter()
            urllib.request.urlopen(base + "/healthz", timeout=10).read()
            return time.perf_counter() - t0

        # a client trickling a 1 MB body over 3 s
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"POST /v1/patterns HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"X-Eroica-Job: slow\r\nContent-Length: 1000000\r\n\r\n".encode())
        stop = threading.Event()

        def trickle() -> None:
            for _ in range(30):
                if stop.wait(0.1):
                    return
                with contextlib.suppress(OSError):
                    s.sendall(b" " * 1000)
        t = threading.Thread(target=trickle)
        t.start()
        slow = [health_seconds() for _ in range(5)]
        # the database's write lock held by someone else for 3 s: a POST waits on it, health does not
        db = sqlite3.connect(tmp_path / "live.db", timeout=1)
        db.execute("BEGIN IMMEDIATE")
        posted: list[int] = []

        def post() -> None:
            req = urllib.request.Request(base + "/v1/patterns", data=incident_docs("INC-0017")[0], method="POST",
                                         headers={**AUTH, "X-Eroica-Job": "locked",
                                                  "Content-Type": "application/json"})
            with contextlib.suppress(OSError):
                posted.append(urllib.request.urlopen(req, timeout=30).status)
        writers = [threading.Thread(target=post) for _ in range(3)]
        for w in writers:
            w.start()
        time.sleep(0.3)
        locked = [health_seconds() for _ in range(5)]
        reads = time.perf_counter()
        urllib.request.urlopen(urllib.request.Request(base + "/v1/jobs", headers=AUTH), timeout=10).read()
        reads = time.perf_counter() - reads
        time.sleep(2.5)
        db.rollback()
        db.close()
        for w in writers:
            w.join(30)
        stop.set()
        t.join()
        s.close()
    assert max(slow) < 0.5 and max(locked) < 0.5, (slow, locked)
    assert reads < 0.5, reads                                          # WAL: readers never wait for the writer
    assert posted == [201, 200, 200] or sorted(posted) == [200, 200, 201], posted    # and the writes went through
