"""eroica beside the real Prometheus and Alertmanager, as a platform team deploys it (docs/deploy.md): a real
Prometheus scrapes `eroica serve` and evaluates the shipped rules (deploy/prometheus/eroica-rules.yml); a real
Alertmanager with the shipped routing (deploy/alertmanager/alertmanager.yml, its waits shortened) receives
eroica's own alerts and Prometheus' alerts, groups them by training job, deduplicates an issue's updates,
inhibits a hang's suspicion once it is confirmed, and resolves each alert when its issue closes or the job steps
again. Everything is read back from Alertmanager's and Prometheus' own APIs."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from monitoring_support import (
    active_alerts,
    alert_groups,
    alertmanager,
    needs_alertmanager,
    needs_prometheus,
    prom_alerts,
    prometheus,
    query,
    targets,
)
from polling import until
from service_support import BACKWARD, LOADER, SERVE_TOKEN, TORCH_WAIT, serve, window_docs

pytestmark = [needs_prometheus, needs_alertmanager]
AUTH = {"Authorization": f"Bearer {SERVE_TOKEN}"}


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={**AUTH, "Content-Type": "application/json", **(headers or {})})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=10).read())


def hang_state(base: str, job: str) -> str | None:
    try:
        return str(get(f"{base}/v1/jobs/{job}/hang")["state"])
    except urllib.error.HTTPError as exc:       # 404 until the worker has made its first verdict
        assert exc.code == 404, exc
        return None


def post_window(base: str, job: str, inc: str, index: int) -> None:
    for body in window_docs(inc, index):
        post(base + "/v1/patterns", body, {"X-Eroica-Job": job, "Content-Encoding": "gzip"})


def post_hang(base: str, job: str, state: str, stalled: float, t0: float) -> None:
    """Each rank's hang snapshot: rank 1 waits in its loader's collate, the others in the backward's
    all-reduce that rank 1 never joins."""
    for rank in range(4):
        snap = {"schema": "eroica.hang/v1", "rank": rank, "world_size": 4, "wall_time": t0 + stalled + rank * 0.01,
                "host": "node-1", "last_step": 30, "stalled_seconds": stalled, "limit_seconds": 300.0,
                "stack": LOADER if rank == 1 else [TORCH_WAIT, BACKWARD], "seq": 94 if rank == 1 else 96,
                "last_entered": None, "last_completed": None, "error": None, "nics": {"eth0": {"operstate": "up"}},
                "peers": {}, "state": state}
        if state == "resolved":
            snap.update(resolved_wall_time=t0 + stalled, resolved_after_seconds=stalled)
        post(f"{base}/v1/jobs/{job}/hang", json.dumps(snap).encode())


def names(alerts: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"]["job"]) for a in alerts}


def test_prometheus_scrapes_serve_and_alertmanager_groups_dedups_inhibits_and_resolves_eroicas_alerts(
        tmp_path: Path) -> None:
    with alertmanager(tmp_path) as am:
        alerts = tmp_path / "alerts.yml"
        alerts.write_text(yaml.safe_dump({"schema": "eroica.alerts/v1", "external_url": "http://eroica.test",
                                          "routes": [{"name": "alertmanager", "kind": "alertmanager", "url": am}]}))
        with serve(tmp_path, "--alerts", str(alerts)) as base, \
                prometheus(tmp_path, [base.removeprefix("http://")], am) as prom:
            until(lambda: [t["health"] for t in targets(prom)] == ["up"], 30)
            # two windows of one job's loader stall, one of another job's degraded NIC: one alert per issue
            post_window(base, "train-a", "INC-0001", 0)
            post_window(base, "train-b", "INC-0024", 0)
            until(lambda: names(active_alerts(am, alertname="EroicaFinding")) == {
                ("EroicaFinding", "train-a"), ("EroicaFinding", "train-b")}, 60)
            post_window(base, "train-a", "INC-0001", 1)
            until(lambda: get(base + "/v1/issues?job=train-a")[0]["windows_total"] == 2, 60)
            until(lambda: not get(base + "/v1/issues?job=train-a")[0]["alert_dirty"], 30)
            until(lambda: [a["annotations"]["windows"] for a in active_alerts(am, job="train-a")] == ["2"], 30)
            (a,) = active_alerts(am, job="train-a")                      # updated in place, not a second alert
            assert (a["labels"]["root_cause"], a["labels"]["category"], a["receivers"]) == (
                "dataloader_stall", "software", [{"name": "job-owners"}])
            (b,) = active_alerts(am, job="train-b")
            assert (b["labels"]["severity"], b["receivers"]) == ("critical", [{"name": "fleet-oncall"}])
            # Prometheus evaluates the shipped recording rules over what it scraped
            until(lambda: query(prom, "eroica:documents_ingested:rate5m > 0"), 30)
            until(lambda: query(prom, 'eroica:issues_open:by_category{category="hardware"} == 1'), 30)

            # a job hangs: suspected in the service, then in Prometheus, then paged by Alertmanager
            t0 = time.time()
            post_hang(base, "job-h", "suspected", 6.0, t0)
            until(lambda: hang_state(base, "job-h") == "suspected", 30)
            until(lambda: active_alerts(am, alertname="EroicaJobHangSuspected", job="job-h"), 30)
            seen = time.time() - t0
            (s,) = active_alerts(am, alertname="EroicaJobHangSuspected")
            assert (s["labels"]["root_cause"], s["labels"]["ranks"], s["receivers"]) == (
                "hang_dataloader", "1", [{"name": "ml-infra-oncall"}]), s
            # confirmed: the critical alert, the suspicion inhibited, and eroica's own finding for the culprit
            post_hang(base, "job-h", "confirmed", 301.0, t0)
            until(lambda: active_alerts(am, alertname="EroicaJobHung", job="job-h"), 30)
            until(lambda: active_alerts(am, alertname="EroicaFinding", job="job-h"), 30)
            until(lambda: [x["status"]["state"] for x in active_alerts(am, alertname="EroicaJobHangSuspected")]
                  in ([], ["suppressed"]), 30)
            (f,) = active_alerts(am, alertname="EroicaFinding", job="job-h")
            assert (f["labels"]["root_cause"], f["labels"]["ranks"]) == ("hang_dataloader", "1")
            # grouped by training job: the hang's finding and anything else of job-h in one of its groups
            grouped = {g["labels"].get("job"): sorted(x["labels"]["alertname"] for x in g["alerts"])
                       for g in alert_groups(am) if g["alerts"]}
            assert "train-a" in grouped and "train-b" in grouped and "job-h" in grouped, grouped
            # the job steps again: Prometheus' hang alert and eroica's hang issue resolve
            post_hang(base, "job-h", "resolved", 320.0, t0)
            until(lambda: not active_alerts(am, job="job-h"), 60)
            assert not [x for x in prom_alerts(prom) if x["labels"].get("job") == "job-h"
                        and x["state"] == "firing"]
            # train-a's issue closes as fixed: its alert resolves; train-b's stays
            (issue,) = get(base + "/v1/issues?job=train-a")
            post(f"{base}/v1/issues/{issue['id']}/recovered", json.dumps({"who": "sre"}).encode())
            until(lambda: not active_alerts(am, job="train-a"), 30)
            assert names(active_alerts(am)) == {("EroicaFinding", "train-b")}
    print(f"hang suspected in the service to EroicaJobHangSuspected in Alertmanager: {seen:.1f} s")
    assert seen < 30, seen
