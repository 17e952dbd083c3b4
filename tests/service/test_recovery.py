"""Recovered GPU time from the job's own step series: a job that comes back within the band of its
healthy step after a finding is closed as recovered, with the accelerator-hours it gave back and the
numbers that produced them; one that stays slow is not."""

from __future__ import annotations

import gzip
import json
import time

from fastapi.testclient import TestClient
from service_support import AUTH, incident_docs

from eroica.service.recovery import Summary, measure, onset


def S(first: int, med: float, world: int = 4) -> Summary:   # noqa: N802 - reads like a row
    return Summary(first, first + 19, med, 1000.0 + first, world)


def test_the_measure_is_the_slow_minus_current_step_times_steps_and_accelerators() -> None:
    before, after = [S(0, 0.10), S(20, 0.10)], [S(60, 0.30), S(80, 0.105), S(100, 0.10)]
    m = measure(before, after, slow=0.30)
    assert m is not None and m["recovered"] and m["recovered_from_step"] == 80
    assert m["accelerator_hours"] == round(((0.30 - 0.105) * 20 * 4 + (0.30 - 0.10) * 20 * 4) / 3600, 6)
    still = measure(before, [S(60, 0.30), S(80, 0.29), S(100, 0.31)], 0.30)
    assert still is not None and not still["recovered"] and still["accelerator_hours"] == 0.0
    # a restart with half the accelerators: its summaries count with its own world size
    restarted = measure(before, [S(60, 0.30), S(0, 0.10, world=2), S(20, 0.10, world=2)], 0.30)
    assert restarted is not None and restarted["recovered"] and restarted["recovered_from_step"] == 0
    assert restarted["accelerator_hours"] == round(2 * (0.30 - 0.10) * 20 * 2 / 3600, 6)


def test_a_large_slowdown_is_recovered_when_nine_tenths_of_it_is_gone_a_small_one_within_the_band() -> None:
    before = [S(0, 0.10), S(20, 0.10)]
    # 4x slower, then back to 0.125-0.128 s: 25% over the healthy step (a host's drift), 91% of the way back
    m = measure(before, [S(60, 0.40), S(80, 0.125), S(100, 0.128)], slow=0.40)
    assert m is not None and m["recovered"] and m["recovered_from_step"] == 80 and m["given_back_ratio"] == 0.907
    # 80% of the way back is not back: the fault is still there in part
    assert not measure(before, [S(60, 0.40), S(80, 0.16), S(100, 0.16)], slow=0.40)["recovered"]  # type: ignore[index]
    # 1.5x slower and 70% of the way back (15% over): the 10% band is the looser limit there, and it holds
    small = measure(before, [S(60, 0.15), S(80, 0.115), S(100, 0.115)], slow=0.15)
    assert small is not None and not small["recovered"] and small["given_back_ratio"] == 0.7
    assert measure(before, [S(60, 0.15), S(80, 0.109), S(100, 0.108)], slow=0.15)["recovered"]  # type: ignore[index]
    # a diagnosis without a slow step (0): no share of the way to give, the band alone decides
    unknown = measure(before, [S(60, 0.10), S(80, 0.10)], slow=0.0)
    assert unknown is not None and unknown["recovered"] and unknown["given_back_ratio"] is None


def test_the_onset_is_where_the_series_turned_slow_before_the_window() -> None:
    healthy, slow = [S(0, 0.10), S(20, 0.11), S(40, 0.10)], [S(60, 0.25), S(80, 0.26)]
    assert onset(healthy + slow) == 3 and onset(healthy) == 3 and onset([]) == 0
    m = measure(healthy + slow, [], 0.26, opened_at=1100.0)
    assert m is not None and m["healthy_seconds"] == 0.10          # the slow phase is not the reference
    assert m["onset_after_step"] == 59 and m["onset_at"] == 1040.0 and m["seconds_to_detect"] == 60.0
    assert measure(slow, [], 0.26) is not None                      # the first summary is the reference then
    # the issue's first window came late into the fault (the earlier one said nothing confident), and
    # the first steps were slow to warm up: the onset is still where the fault began (a CI run's series)
    late = [S(1, 0.0659), S(21, 0.1559), S(41, 0.1554), S(61, 0.1551)]
    assert onset(late) == 1 and measure(late, [], 0.16)["healthy_seconds"] == 0.0659  # type: ignore[index]
    assert onset([S(0, 0.20), S(20, 0.10), S(40, 0.10), S(60, 0.25), S(80, 0.25)]) == 3      # warm-up
    assert onset([S(0, 0.10), S(20, 0.25), S(40, 0.10), S(60, 0.10), S(80, 0.26)]) == 4      # a blip
    no_onset = measure(healthy, [], 0.26, opened_at=1100.0)
    assert no_onset is not None and no_onset["seconds_to_detect"] is None   # it turned slow inside the window


def _steps(c: TestClient, job: str, meds: list[tuple[int, float]], name: str | None = None) -> None:
    for first, med in meds:
        r = c.post(f"/v1/jobs/{job}/steps", headers={**AUTH, **({"X-Eroica-Job-Name": name} if name else {})},
                   json={"first_step": first, "last_step": first + 19, "median_seconds": med,
                         "p90_seconds": med * 1.1, "world_size": 4})
        assert r.status_code == 201, r.text


def _windows(c: TestClient, job: str, name: str | None = None) -> None:
    for d in incident_docs("INC-0017"):
        r = c.post("/v1/patterns", content=gzip.compress(d), headers={
            **AUTH, "X-Eroica-Job": job, "Content-Encoding": "gzip", **({"X-Eroica-Job-Name": name} if name else {})})
        assert r.status_code in (200, 201), r.text


def _until(c: TestClient, what: str, ok: object, seconds: float = 60) -> list[dict[str, object]]:
    t0 = time.time()
    while True:
        got = c.get("/v1/issues", params={"job": what}).json()
        if ok(got):  # type: ignore[operator]
            return got  # type: ignore[no-any-return]
        assert time.time() - t0 < seconds, got
        time.sleep(0.2)


def test_a_restarted_job_is_followed_one_issue_across_its_runs_and_recovers_in_the_new_run(
        client: TestClient) -> None:
    _steps(client, "llm.run-1", [(0, 0.078), (20, 0.08)], name="llm")
    _windows(client, "llm.run-1", name="llm")
    (first,) = _until(client, "llm.run-1", lambda g: len(g) == 1)
    assert client.get("/v1/jobs").json()[0]["name"] == "llm"
    _windows(client, "llm.run-2", name="llm")                 # the job restarted, still slow: the same issue
    (moved,) = _until(client, "llm.run-2", lambda g: len(g) == 1 and g[0]["windows_total"] == 2)
    assert moved["id"] == first["id"] and moved["runs"] == ["llm.run-1", "llm.run-2"]
    assert "followed from run llm.run-1 to llm.run-2" in moved["history"][-1]["why"]
    assert client.get("/v1/issues", params={"job": "llm.run-1"}).json() == []
    _steps(client, "llm.run-3", [(0, 0.079), (20, 0.08)], name="llm")   # restarted again, fixed
    (done,) = _until(client, "llm.run-2", lambda g: g[0]["state"] == "recovered")
    rec = done["recovery"]
    assert rec["recovered_from_step"] == 0 and rec["healthy_seconds"] == 0.079 and rec["accelerator_hours"] > 0
    other = "other.run-1"                                       # another job's run is not followed
    _windows(client, other, name="other")
    (o,) = _until(client, other, lambda g: len(g) == 1)
    assert o["id"] != first["id"] and o["runs"] == [other]


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
    assert fixed["history"][-1]["who"] == "eroica" and "back is within 10% of healthy" in fixed["history"][-1]["why"]
    (slow,) = client.get("/v1/issues", params={"job": "still-slow"}).json()
    assert slow["state"] == "open" and slow["recovery"]["recovered"] is False
    text = client.get("/metrics").text
    assert 'eroica_findings_recovered_total{root_cause="cpu_contention"} 1.0' in text
    assert f"eroica_recovered_accelerator_hours_total {rec['accelerator_hours']}" in text
    assert f"eroica_week_accelerator_hours_recovered {rec['accelerator_hours']}" in text
    assert 'eroica_issues{category="software",state="recovered"} 1.0' in text
    assert 'eroica_week_median_seconds{stage="mitigate"}' in text
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
                 "eroica_windows", "eroica_issues", "eroica_week_median_seconds",
                 "eroica_week_accelerator_hours_recovered"):
        assert name in fams, sorted(fams)
    assert fams["eroica_time_to_diagnosis_seconds"].type == "histogram"
