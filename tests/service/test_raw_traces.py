"""Kept raw traces through the service: the collector's sink sends a suspect's window trace, the
service keeps a job's newest few, lists them on the job's JSON and page, and serves each one back as
the Chrome trace the rank wrote (to open in Perfetto)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from fastapi.testclient import TestClient
from service_support import AUTH, TOKEN, incident_docs

from eroica.collector.sink import PatternSink
from eroica.schema.raw_trace import RawTraceHeader, pack
from eroica.service import traces

TRACE = {"traceEvents": [{"name": "DataLoader.__next__", "ph": "X", "ts": 10, "dur": 420000, "pid": 1, "tid": 1},
                         {"name": "aten::mm", "ph": "X", "ts": 420100, "dur": 900, "pid": 1, "tid": 1}],
         "displayTimeUnit": "ms"}


def upload(window: str, rank: int, world: int = 4, trace: object = TRACE) -> bytes:
    return pack(RawTraceHeader(window_id=window, rank=rank, world_size=world, host="node-1"),
                json.dumps(trace).encode())


def test_a_kept_trace_is_stored_listed_on_its_window_and_served_back(client: TestClient) -> None:
    for body in incident_docs("INC-0017"):        # the window's pattern documents, then its traces
        assert client.post("/v1/patterns", content=body, headers={**AUTH, "X-Eroica-Job": "job-t"}).status_code in (
            200, 201)
    job = client.get("/v1/jobs/job-t", headers=AUTH).json()
    wid, world = job["windows"][0]["window_id"], job["world_size"]
    assert job["windows"][0]["raw_traces"] == []
    for rank in (2, 0):
        r = client.post("/v1/jobs/job-t/traces", content=upload(wid, rank, world), headers=AUTH)
        assert r.status_code == 201 and r.json()["window_id"] == wid, r.text
    job = client.get("/v1/jobs/job-t", headers=AUTH).json()
    kept = job["windows"][0]["raw_traces"]
    assert [t["rank"] for t in kept] == [0, 2] and kept[0]["host"] == "node-1" and kept[0]["trace_bytes"] > 100
    got = client.get(kept[1]["url"], headers=AUTH)
    assert got.status_code == 200 and got.json() == TRACE
    assert "attachment" in got.headers["content-disposition"]
    page = client.get("/jobs/job-t", headers=AUTH).text
    assert "raw traces, to open in Perfetto" in page and kept[1]["url"] in page
    assert client.get(f"/v1/jobs/job-t/traces/{wid}/3", headers=AUTH).status_code == 404


def test_a_job_keeps_its_newest_traces_only(client: TestClient) -> None:
    for i in range(traces.MAX_PER_JOB + 3):
        assert client.post("/v1/jobs/job-n/traces", content=upload(f"w{i:03d}-s{i * 10}", 1),
                           headers=AUTH).status_code == 201
    kept = client.get("/v1/jobs/job-n/traces", headers=AUTH).json()
    assert sum(len(v) for v in kept.values()) == traces.MAX_PER_JOB
    assert "w000-s0" not in kept and f"w{traces.MAX_PER_JOB + 2:03d}-s{(traces.MAX_PER_JOB + 2) * 10}" in kept


def test_a_bad_upload_is_refused_naming_what_is_wrong(client: TestClient) -> None:
    url = "/v1/jobs/job-b/traces"
    r = client.post(url, content=b"{", headers=AUTH)
    assert r.status_code == 400
    r = client.post(url, content=upload("w001-s10", 1, trace={"events": []}), headers=AUTH)
    assert r.status_code == 422 and "traceEvents" in r.text
    r = client.post(url, content=upload("w001-s10", 4, world=4), headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (422, "rank")
    bad = json.loads(upload("w001-s10", 1))
    bad["window_id"] = "../../etc/passwd"
    r = client.post(url, content=json.dumps(bad).encode(), headers=AUTH)
    assert r.status_code == 422 and "window_id" in r.text
    assert client.post(url, content=upload("w001-s10", 1), headers={}).status_code == 401
    assert client.get("/v1/jobs/job-b/traces", headers=AUTH).json() == {}


def test_the_collectors_sink_sends_a_kept_trace_file(tmp_path: Path, live: str) -> None:
    f = tmp_path / "rank-1.trace.json"
    f.write_text(json.dumps(TRACE))
    sink = PatternSink(live, "job-s", tmp_path / "spool", token=TOKEN)
    assert sink.submit_trace("w002-s40", 1, 4, "node-2", f)
    assert not sink.submit_trace("w002-s40", 1, 4, "node-2", tmp_path / "missing.json")   # said, not raised
    assert sink.close(10.0)
    msgs = sink.messages()
    assert sink.sent == 1 and any("missing.json" in m for m in msgs), msgs
    req = urllib.request.Request(f"{live}/v1/jobs/job-s/traces/w002-s40/1", headers=AUTH)
    deadline = time.monotonic() + 5
    while True:
        try:
            got = json.loads(urllib.request.urlopen(req, timeout=5).read())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert got == TRACE
