"""Recovered GPU time from the job's own step series: a job that comes back within the band of its
healthy step after a finding is closed as recovered, with the accelerator-hours it gave back and the
numbers that produced them; one that stays slow is not."""

from __future__ import annotations

import gzip
import json
import time

from fastapi.testclient import TestClient
from service_support import AUTH, incident_docs

from eroica.service.recovery import measure


class S:
    def __init__(self, first: int, last: int, med: float) -> None:
        self.first_step, self.last_step, self.median_seconds = first, last, med


def test_the_measure_is_the_slow_minus_current_step_times_steps_and_accelerators() -> None:
    series = [S(0, 19, 0.10), S(20, 39, 0.10), S(40, 59, 0.30), S(60, 79, 0.30), S(80, 99, 0.105), S(100, 119, 0.10)]
    m = measure(series, first_start=45, last_end=60, slow=0.30, world=4)
    assert m is not None and m["recovered"] and m["recovered_from_step"] == 80
    assert m["accelerator_hours"] == round(((0.30 - 0.105) * 20 * 4 + (0.30 - 0.10) * 20 * 4) / 3600, 6)
    still = measure(series[:4] + [S(80, 99, 0.29), S(100, 119, 0.31)], 45, 60, 0.30, 4)
    assert still is not None and not still["recovered"] and still["accelerator_hours"] == 0.0


def _steps(c: TestClient, job: str, meds: list[tuple[int, float]]) -> None:
    for first, med in meds:
        r = c.post(f"/v1/jobs/{job}/steps", headers=AUTH, json={"first_step": first, "last_step": first + 19,
                   "median_seconds": med, "p90_seconds": med * 1.1, "world_size": 4})
        assert r.status_code == 201, r.text


def test_the_service_closes_a_recovered_issue_with_its_numbers_and_leaves_a_slow_one_open(client: TestClient) -> None:
    for job, after in (("fixed", [(60, 0.08), (80, 0.079)]), ("still-slow", [(60, 0.2), (80, 0.21)])):
        _steps(client, job, [(0, 0.078), (20, 0.08)])          # healthy, before the window (steps 34-41)
        for d in incident_docs("INC-0017"):
            client.post("/v1/patterns", content=gzip.compress(d), headers={**AUTH, "X-Eroica-Job": job,
                                                                            "Content-Encoding": "gzip"})
        t0 = time.time()
        while not client.get("/v1/issues", params={"job": job}).json():
            assert time.time() - t0 < 60
            time.sleep(0.2)
        _steps(client, job, after)
    t0 = time.time()
    while client.get("/v1/issues", params={"job": "fixed"}).json()[0]["state"] != "recovered":
        assert time.time() - t0 < 30
        time.sleep(0.2)
    (fixed,) = client.get("/v1/issues", params={"job": "fixed"}).json()
    rec = fixed["recovery"]
    assert rec["recovered"] and rec["recovered_from_step"] == 60 and rec["accelerator_hours"] > 0
    assert rec["accelerator_hours"] == round(((rec["slow_seconds"] - 0.08) + (rec["slow_seconds"] - 0.079))
                                             * 20 * 4 / 3600, 6)
    assert fixed["history"][-1]["who"] == "eroica" and "back within 10%" in fixed["history"][-1]["why"]
    (slow,) = client.get("/v1/issues", params={"job": "still-slow"}).json()
    assert slow["state"] == "open" and slow["recovery"]["recovered"] is False
    text = client.get("/metrics").text
    assert 'eroica_findings_recovered_total{root_cause="cpu_contention"} 1.0' in text
    assert f"eroica_recovered_accelerator_hours_total {rec['accelerator_hours']}" in text
    week = client.get("/v1/summary", params={"days": 7}).json()
    assert (week["slowdowns"], week["fixed"]) == (2, 1)
    assert week["accelerator_hours_recovered"] == rec["accelerator_hours"] and week["median_seconds_to_mitigate"] > 0
    assert "The last 7 days" in client.get("/").text
    json.dumps(rec)


def test_the_metrics_parse_with_prometheus_clients_own_parser(client: TestClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    for name in ("eroica_documents_ingested", "eroica_ingest_errors", "eroica_windows_diagnosed", "eroica_findings",
                 "eroica_time_to_diagnosis_seconds", "eroica_recovered_accelerator_hours", "eroica_findings_recovered",
                 "eroica_windows"):
        assert name in fams, sorted(fams)
    assert fams["eroica_time_to_diagnosis_seconds"].type == "histogram"
