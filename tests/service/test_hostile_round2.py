"""Issue 54's attacks on the API, the pages and the CLI, each reproduced: deep JSON is a 400 (not a 500), a job
token reads and writes only its own jobs (its raw traces included), the alert claim outlives the slowest route's
delivery, every response says nosniff and may not be framed, a session can sign out, and a gzip bomb given to
`eroica ingest kineto` is never inflated whole. (The watch root's: test_watch_hostile.py; the spool's URL:
tests/unit/collector/test_sink.py.)"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from service_support import AUTH, LOCAL, TOKEN, incident_docs

from eroica.service.alerts import AlertConfig, Deliverer
from eroica.service.app import Settings, create_app

TEAM_A = "team-a-token-0123456789"


def app(tmp: Path, **kw: object) -> TestClient:
    return TestClient(create_app(Settings(db_url=f"sqlite:///{tmp / 'h.db'}", token=TOKEN,   # type: ignore[arg-type]
                                          job_tokens={TEAM_A: "team-a*"}, **kw), start=False), base_url=LOCAL)


def trace_body(trace: bytes) -> bytes:
    return b'{"window_id":"w000-s10","rank":0,"world_size":4,"trace":' + trace + b"}"


def test_json_nested_90000_deep_is_a_400_naming_the_field_never_a_500(tmp_path: Path) -> None:
    with app(tmp_path) as c:
        deep = b"[" * 90_000 + b"]" * 90_000
        r = c.post("/v1/jobs/job-x/traces", content=trace_body(deep), headers=AUTH)
        assert r.status_code == 400 and r.json()["field"] == "trace" and "nested too deep" in r.json()["error"]
        r = c.post("/v1/patterns", content=b'{"a":' * 90_000 + b"1" + b"}" * 90_000,
                   headers={**AUTH, "X-Eroica-Job": "job-x"})
        assert 400 <= r.status_code < 500, r.text


def test_a_job_token_reads_and_writes_only_its_own_jobs(tmp_path: Path) -> None:
    with app(tmp_path, read_token=True) as c:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        d = incident_docs("INC-0017")[0]
        assert c.post("/v1/patterns", content=d, headers={**AUTH, "X-Eroica-Job": "team-b.run-1"}).status_code == 201
        ours = {**a, "X-Eroica-Job": "team-a.run-1", "X-Eroica-Job-Name": "team-a"}
        assert c.post("/v1/patterns", content=d, headers=ours).status_code == 201
        # its raw traces are its job's documents too
        trace = json.dumps({"traceEvents": [{"ph": "X", "name": "step", "ts": 0, "dur": 5}]}).encode()
        assert c.post("/v1/jobs/team-a.run-1/traces", content=trace_body(trace), headers=a).status_code == 201
        assert c.post("/v1/jobs/team-b.run-1/traces", content=trace_body(trace), headers=a).status_code == 403
        # reads: its own job, yes; another team's, the fleet's lists and the pages, no
        assert c.get("/v1/jobs/team-a.run-1", headers=a).status_code == 200
        for path in ("/v1/jobs/team-b.run-1", "/v1/jobs", "/v1/issues", "/v1/hosts", "/"):
            r = c.get(path, headers=a)
            assert r.status_code == 403 and r.json()["field"] == "authorization", (path, r.status_code)
        assert c.get("/v1/jobs", headers=AUTH).status_code == 200 and c.get("/metrics", headers=a).status_code == 200


def test_the_alert_claim_outlives_the_slowest_routes_longest_delivery() -> None:
    cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "routes": [
        {"name": "fast", "kind": "alertmanager", "url": "http://a:9093"},
        {"name": "slow", "kind": "webhook", "url": "http://b/x", "attempts": 10, "timeout_seconds": 60}]})
    slow = cfg.routes[1].longest_seconds
    assert slow == 10 * 60 + 0.5 * (2 ** 9 - 1)                       # 855.5 s: past the old 120 s claim
    assert Deliverer(None, cfg).claim_seconds >= 2 * slow               # type: ignore[arg-type]
    quick = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "routes": [
        {"name": "fast", "kind": "alertmanager", "url": "http://a:9093"}]})
    assert Deliverer(None, quick).claim_seconds == Deliverer.CLAIM_SECONDS   # type: ignore[arg-type]


def test_every_response_says_nosniff_and_is_never_framed_and_a_session_signs_out(tmp_path: Path) -> None:
    with app(tmp_path, read_token=True) as c:
        for r in (c.get("/healthz"), c.get("/v1/jobs"), c.get("/login"), c.get("/v1/jobs", headers=AUTH)):
            assert r.headers["x-content-type-options"] == "nosniff", r.url
            assert r.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        r = c.post("/login", content=f"token={TOKEN}&next=/".encode(), follow_redirects=False,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 303 and "eroica_session=" in r.headers["set-cookie"]
        page = c.get("/")
        assert page.status_code == 200 and 'action="/logout"' in page.text
        r = c.post("/logout", content=b"", follow_redirects=False,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert 'eroica_session=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
        c.cookies.clear()
        assert c.get("/", follow_redirects=False).status_code == 303                # signed out: to the login


def test_a_gzip_bomb_given_to_ingest_kineto_is_never_inflated_whole(tmp_path: Path) -> None:
    bomb = tmp_path / "rank0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=6) as f:                  # 300 MB once decompressed
        for _ in range(300):
            f.write(b" " * (1 << 20))
    assert bomb.stat().st_size < 1 << 20
    # a fresh parent whose only child is the command: its children's peak is the command's own
    measure = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(p.stdout); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", measure, str(Path(sys.executable).parent / "eroica"), "ingest", "kineto",
                        str(bomb), "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    peak_kb = p.stdout.split()[-1]
    assert "0 rank(s) ingested, 1 skipped" in p.stdout, p.stdout + p.stderr
    assert int(peak_kb) / 1024 < 250, f"{int(peak_kb) / 1024:.0f} MB peak"
