"""Hosts that keep failing: three jobs with confident hardware findings on one host put it on the
drain list (JSON and plain text); a host with only a low-confidence finding never is."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import AUTH, LOCAL, TOKEN, incident_docs

from eroica.service.app import Settings, create_app


def post(c: TestClient, inc: str, job: str, host: str) -> None:
    for d in incident_docs(inc):
        doc = json.loads(d)
        doc["job"]["hostname"] = host
        doc["job"]["device"] = f"cuda:{doc['job']['rank']}"
        r = c.post("/v1/patterns", content=gzip.compress(json.dumps(doc).encode()),
                   headers={**AUTH, "X-Eroica-Job": job, "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text


def test_three_hardware_incidents_on_one_host_drain_it_and_a_low_confidence_finding_does_not(
        tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'f.db'}", token=TOKEN, grace_seconds=1.0,
                              poll_seconds=0.1, drain_min_jobs=3))
    with TestClient(app, base_url=LOCAL) as c:
        for inc, job in (("INC-0024", "a"), ("INC-0025", "b"), ("INC-0002", "c")):   # nic, nic, cpu quota
            post(c, inc, job, "gpu-node-17")
        post(c, "INC-0032", "d", "gpu-node-3")        # a one-off stall: hardware, below 0.5
        post(c, "INC-0001", "e", "gpu-node-3")        # a software finding
        t0 = time.time()
        while not all(w["status"] == "done" for j in "abcde" for w in c.get(f"/v1/jobs/{j}").json()["windows"]):
            assert time.time() - t0 < 120
            time.sleep(0.3)
        drain = c.get("/v1/drain").json()
        assert [h["host"] for h in drain["hosts"]] == ["gpu-node-17"] and drain["hosts"][0]["hardware_jobs"] == 3
        assert c.get("/v1/drain", params={"format": "text"}).text == "gpu-node-17\n"
        ranking = {h["host"]: h for h in c.get("/v1/hosts").json()}
        assert ranking["gpu-node-3"]["hardware_jobs"] == 0             # its low-confidence stall is no issue
        assert "nic_degraded" in ranking["gpu-node-17"]["root_causes"]
        issues = {i["job_id"]: i for i in c.get("/v1/issues").json()}
        named = {f"cuda:{r}" for j in "abc" for r in issues[j]["ranks"].split(",")}
        assert set(ranking["gpu-node-17"]["devices"]) == named                  # the devices, not just the host
        assert all(d.startswith("gpu-node-17/cuda:") for j in "abc" for d in issues[j]["devices"])
        page = c.get("/hosts").text
        assert "gpu-node-17" in page and "drain" in page and sorted(named)[0] in page
        # a finding row says where its ranks run, as the diagnosis does
        for f in c.get("/v1/findings", params={"job": "a"}).json():
            assert f["devices"] and all(d.startswith("gpu-node-17/cuda:") for d in f["devices"])
            assert f["scope"] in ("rank", "host")
        # the host filter pages through the newest findings until it has `limit` matches: whichever
        # host's finding is newest, the other host's page of one is not empty
        for host, n in (("gpu-node-17", 1), ("gpu-node-3", 1), ("gpu-node-17", 3)):
            got = c.get("/v1/findings", params={"host": host, "limit": n}).json()
            assert len(got) == n and all(host in f["hosts"] for f in got), (host, got)


def test_the_drain_thresholds_are_validated() -> None:
    with pytest.raises(ValueError, match="drain_min_jobs"):
        Settings(db_url="sqlite://", drain_min_jobs=0)
    with pytest.raises(ValueError, match="a lead is never a drain"):
        Settings(db_url="sqlite://", drain_min_confidence=0.3)
