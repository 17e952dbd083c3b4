"""Alerts to the real Alertmanager on 127.0.0.1 (Debian's prometheus-alertmanager, read back from its own
API): routed by category, one alert per issue across windows (updated, never a new page), resolved when the
issue is closed or the run ends, sent again before Alertmanager would let it lapse. Hand-written receivers
stand in only where no real one can: a generic webhook and a Slack incoming webhook, and a receiver made slow
on purpose (a delivery that times out never holds up a diagnosis; a change made while an alert is on the wire
is sent after it; replicas send each alert once)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from monitoring_support import active_alerts, alertmanager, needs_alertmanager
from polling import until
from service_support import AUTH, LOCAL, TOKEN, Receiver, incident_docs, window_docs

from eroica.service.alerts import AlertConfig, Deliverer, load_alerts
from eroica.service.app import Settings, create_app


def app_with(tmp: Path, cfg: AlertConfig) -> TestClient:
    return TestClient(create_app(Settings(db_url=f"sqlite:///{tmp / 'a.db'}", token=TOKEN, grace_seconds=1.0,
                                          poll_seconds=0.1, alerts=cfg)), base_url=LOCAL)


def post_window(c: TestClient, job: str, inc: str, index: int = 0) -> None:
    for body in window_docs(inc, index):
        r = c.post("/v1/patterns", content=body, headers={**AUTH, "X-Eroica-Job": job, "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text



@needs_alertmanager
def test_one_alert_per_issue_routed_by_category_updated_across_windows_then_resolved(tmp_path: Path) -> None:
    """Two eroica routes to two real Alertmanagers (the fleet's and the owners'), read back from their APIs."""
    with alertmanager(tmp_path / "hw") as hw, alertmanager(tmp_path / "sw") as sw:
        cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "external_url": "http://eroica.test",
                                          "routes": [
            {"name": "fleet-oncall", "match": {"category": "hardware"}, "kind": "alertmanager", "url": hw},
            {"name": "job-owners", "match": {"category": "software"}, "kind": "alertmanager", "url": sw}]})
        with app_with(tmp_path, cfg) as c:
            post_window(c, "train-a", "INC-0001", 0)               # dataloader_stall: software
            post_window(c, "train-b", "INC-0024", 0)               # nic_degraded: hardware
            until(lambda: active_alerts(sw) and active_alerts(hw))
            (a,) = active_alerts(sw)
            assert a["labels"] == {"alertname": "EroicaFinding", "job": "train-a", "root_cause": "dataloader_stall",
                                   "category": "software", "host": "vm", "ranks": "1", "severity": "warning",
                                   "device": "cpu"}
            assert a["generatorURL"] == "http://eroica.test/jobs/train-a" and a["annotations"]["state"] == "open"
            (b,) = active_alerts(hw)
            assert (b["labels"]["root_cause"], b["labels"]["severity"]) == ("nic_degraded", "critical")
            # the same fault in two more windows: the same alert, updated
            post_window(c, "train-a", "INC-0001", 1)
            post_window(c, "train-a", "INC-0001", 2)
            until(lambda: c.get("/v1/issues", params={"job": "train-a"}).json()[0]["windows_total"] == 3)
            until(lambda: not c.get("/v1/issues", params={"job": "train-a"}).json()[0]["alert_dirty"])
            (issue,) = c.get("/v1/issues", params={"job": "train-a"}).json()
            (a3,) = active_alerts(sw)
            assert a3["labels"] == a["labels"] and a3["annotations"]["windows"] == "3"
            assert a3["fingerprint"] == a["fingerprint"]
            # fixed: resolved, so no longer among Alertmanager's alerts; the other route's stays
            c.post(f"/v1/issues/{issue['id']}/recovered", headers=AUTH, content=json.dumps({"who": "sre"}))
            until(lambda: not active_alerts(sw))
            assert [x["labels"]["job"] for x in active_alerts(hw)] == ["train-b"]


def test_a_receiver_that_times_out_never_holds_up_diagnosis_and_the_failure_is_stored_and_shown(
        tmp_path: Path) -> None:
    slow = Receiver(delay=3.0)
    try:
        cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "retry_seconds": 0.5, "routes": [
            {"name": "slow", "kind": "alertmanager", "url": slow.url, "timeout_seconds": 0.3, "attempts": 2}]})
        with app_with(tmp_path, cfg) as c:
            t0 = time.time()
            post_window(c, "train-c", "INC-0001", 0)
            until(lambda: c.get("/v1/jobs/train-c").json()["windows"][0]["status"] == "done", 30)
            assert time.time() - t0 < 20
            until(lambda: c.get("/v1/issues").json()[0]["alert_attempts"] >= 2, 30)   # retried
            (i,) = c.get("/v1/issues").json()
            assert i["alert_state"] == "failed" and "slow" in i["alert_error"] and i["alert_dirty"]
            assert "Undelivered alerts" in c.get("/").text
    finally:
        slow.close()


@needs_alertmanager
def test_a_runs_end_resolves_its_open_alerts_whether_it_says_so_or_falls_silent(tmp_path: Path) -> None:
    with alertmanager(tmp_path) as am:
        cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "routes": [
            {"name": "all", "kind": "alertmanager", "url": am}]})
        app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'e.db'}", token=TOKEN, grace_seconds=1.0,
                                  poll_seconds=0.1, alerts=cfg, job_silent_seconds=4.0))
        with TestClient(app, base_url=LOCAL) as c:
            post_window(c, "said-end", "INC-0001", 0)
            until(lambda: active_alerts(am, job="said-end"))
            assert c.post("/v1/jobs/said-end/end", headers=AUTH).json() == {"status": "ended"}   # rank 0 closed
            until(lambda: not active_alerts(am, job="said-end"))                               # resolved
            (i,) = c.get("/v1/issues", params={"job": "said-end"}).json()
            assert i["state"] == "open" and i["alert_state"] == "delivered"
            assert c.get("/v1/jobs").json()[0]["ended_by"] == "job"
            assert c.post("/v1/jobs/nope/end", headers=AUTH).status_code == 404
            post_window(c, "went-silent", "INC-0001", 0)              # killed without closing: silence ends it
            until(lambda: active_alerts(am, job="went-silent"))
            until(lambda: not active_alerts(am, job="went-silent"), 30)
            assert {j["id"]: j["ended_by"] for j in c.get("/v1/jobs").json()}["went-silent"] == "silence"


@needs_alertmanager
def test_an_open_issue_is_sent_again_before_alertmanager_would_let_it_lapse(tmp_path: Path) -> None:
    """Alertmanager resolves an alert at its endsAt unless it is sent again: eroica sends an open issue's alert
    again every resend_seconds, each time ending four of them later (a Slack route gets no reminder)."""
    with alertmanager(tmp_path) as am:
        cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "resend_seconds": 10, "routes": [
            {"name": "am", "match": {"category": "software"}, "kind": "alertmanager", "url": am}]})
        with app_with(tmp_path, cfg) as c:
            post_window(c, "long", "INC-0001", 0)
            until(lambda: active_alerts(am, job="long"))
            until(lambda: not c.get("/v1/issues").json()[0]["alert_dirty"])
            (first,) = active_alerts(am, job="long")
            deliverer = Deliverer(c.app.state.svc.eng, cfg, "test")   # type: ignore[attr-defined]
            assert deliverer.refresh(time.time()) == 0                    # sent just now: nothing to do
            assert deliverer.refresh(time.time() + 11) == 1
            until(lambda: active_alerts(am, job="long")[0]["endsAt"] > first["endsAt"])
            (again,) = active_alerts(am, job="long")
            assert again["fingerprint"] == first["fingerprint"]          # the same alert, its end moved on


def test_a_generic_webhook_and_a_slack_webhook_get_their_own_formats_firing_then_resolved(tmp_path: Path) -> None:
    hook, slack = Receiver(path="/hooks/eroica"), Receiver(path="/services/T0/B0/x")
    try:
        cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "external_url": "http://eroica.test",
                                          "routes": [
            {"name": "fleet-hook", "match": {"category": "hardware"}, "kind": "webhook",
             "url": hook.url + "/hooks/eroica"},
            {"name": "owners-slack", "match": {"category": "software"}, "kind": "slack",
             "url": slack.url + "/services/T0/B0/x"}]})
        with app_with(tmp_path, cfg) as c:
            post_window(c, "train-h", "INC-0024", 0)               # nic_degraded: hardware, to the webhook
            post_window(c, "train-s", "INC-0001", 0)               # dataloader_stall: software, to Slack
            until(lambda: hook.got and slack.got)
            w = hook.got[0]
            assert isinstance(w, dict) and (w["version"], w["status"], w["receiver"]) == ("4", "firing", "fleet-hook")
            (a,) = w["alerts"]
            assert a["status"] == "firing" and a["labels"]["root_cause"] == "nic_degraded"
            assert w["commonLabels"]["job"] == "train-h" and a["generatorURL"] == "http://eroica.test/jobs/train-h"
            text = slack.got[0]["text"]                              # type: ignore[call-overload]
            assert text.startswith("[FIRING] dataloader_stall on rank(s) 1 of job train-s")
            assert text.endswith("http://eroica.test/jobs/train-s")
            for job in ("train-h", "train-s"):
                (i,) = c.get("/v1/issues", params={"job": job}).json()
                c.post(f"/v1/issues/{i['id']}/recovered", headers=AUTH, content=json.dumps({"who": "sre"}))
            until(lambda: hook.got[-1]["status"] == "resolved" and slack.got[-1]["text"].startswith("[RESOLVED]"))  # type: ignore[call-overload]
            assert all(i["alert_state"] == "delivered" for i in c.get("/v1/issues").json())
    finally:
        hook.close()
        slack.close()


def test_the_alert_file_is_validated_with_the_file_and_the_field(tmp_path: Path) -> None:
    f = tmp_path / "alerts.yaml"
    f.write_text("schema: eroica.alerts/v1\nroutes:\n  - {name: x, kind: pager, url: ftp://nope}\n")
    with pytest.raises(ValueError) as e:
        load_alerts(f)
    msg = str(e.value)
    assert f"{f}: routes.0.kind" in msg and f"{f}: routes.0.url" in msg


def test_a_change_made_while_its_alert_is_on_the_wire_is_sent_after_it(tmp_path: Path) -> None:
    slow = Receiver(delay=1.5)                               # the first delivery takes 1.5 s
    cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "routes": [
        {"name": "all", "kind": "alertmanager", "url": slow.url}]})
    try:
        with app_with(tmp_path, cfg) as c:
            post_window(c, "train-x", "INC-0001", 0)
            until(lambda: c.get("/v1/issues").json() and c.get("/v1/issues").json()[0]["alert_claimed_by"])
            iid = c.get("/v1/issues").json()[0]["id"]          # its alert is being sent now: acknowledge it
            r = c.post(f"/v1/issues/{iid}/ack", content=b'{"who": "alice"}', headers=AUTH)
            assert r.status_code == 200
            until(lambda: len(slow.got) == 2, 30)                # the acknowledgement went out too
            assert [a[0]["annotations"]["state"] for a in slow.got] == ["open", "acknowledged"]
            until(lambda: not c.get("/v1/issues").json()[0]["alert_dirty"])
    finally:
        slow.close()


def test_replicas_send_each_alert_once(tmp_path: Path) -> None:
    from eroica.service.app import Service

    recv = Receiver(delay=0.5)
    cfg = AlertConfig.model_validate({"schema": "eroica.alerts/v1", "routes": [
        {"name": "all", "kind": "alertmanager", "url": recv.url}]})
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = Service(Settings(db_url=url, alerts=cfg, poll_seconds=0.05, grace_seconds=1, name="replica-a"))
    b = Service(Settings(db_url=url, alerts=cfg, poll_seconds=0.05, grace_seconds=1, name="replica-b"))
    try:
        for job in ("j1", "j2", "j3"):
            for d in incident_docs("INC-0001"):
                a.accept(job, d, "test")
        a.start()
        b.start()
        until(lambda: len(recv.got) >= 3, 120)
        time.sleep(2.0)                                       # and nothing more comes
        jobs_alerted = sorted(x[0]["labels"]["job"] for x in recv.got)
        assert jobs_alerted == ["j1", "j2", "j3"], jobs_alerted
    finally:
        a.stop()
        b.stop()
        recv.close()
