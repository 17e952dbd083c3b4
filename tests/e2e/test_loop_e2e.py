"""The loop, end to end, on a real 4-rank gloo job under `eroica serve`: a dataloader stall is
injected, diagnosed online and alerted once to a real Alertmanager v2 receiver on 127.0.0.1; an SRE
acknowledges and links it through the API; the fault is lifted inside the same running job (the
fix); the service sees the job's step time come back, closes the issue as recovered with the
accelerator-hours it gave back, and the alert resolves. The same job with the fault left in stays
not recovered."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from service_support import SERVE_TOKEN as TOKEN
from service_support import Receiver, get, serve

from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def post(url: str, path: str, body: dict) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    return dict(json.loads(urllib.request.urlopen(req, timeout=10).read()))


@pytest.mark.parametrize("lifted", [True, False], ids=["fixed", "not-fixed"])
def test_slow_localized_alerted_fixed_recovered(tmp_path: Path, lifted: bool) -> None:
    am = Receiver()
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text(f"schema: eroica.alerts/v1\nroutes:\n  - {{name: owners, kind: alertmanager, url: {am.url}}}\n")
    try:
        with serve(tmp_path, "--alerts", str(alerts)) as url:
            # a stall of 4-6x the healthy step, so that "back" (90% of the way) stands clear of this host's drift
            extra = ["--stop-after-windows", "100", "--stall-seconds", "0.24"]
            extra += ["--fault-until", "110"] if lifted else []
            box: dict[str, object] = {}
            t = threading.Thread(target=lambda: box.update(res=launch(
                tmp_path / "job-loop", fault="dataloader_stall", fault_rank=1, fault_step=25, steps=240,
                extra_args=extra, env={"EROICA_SINK": url, "EROICA_SINK_TOKEN": TOKEN}, progress=False)))
            t.start()
            issue = None
            while t.is_alive() and issue is None:
                issue = next((i for i in get(url + "/v1/issues?job=job-loop")  # type: ignore[union-attr]
                              if i["root_cause"] == "dataloader_stall" and i["ranks"] == "1"), None)
                time.sleep(0.3)
            assert issue is not None, "no dataloader_stall issue while the job ran"
            post(url, f"/v1/issues/{issue['id']}/ack", {"who": "sre-oncall"})
            post(url, f"/v1/issues/{issue['id']}/link", {"who": "sre-oncall", "url": "CR-1234",
                                                         "kind": "change_request"})
            t.join()
            assert box["res"].ok  # type: ignore[attr-defined]
            deadline = time.time() + 30
            while time.time() < deadline:
                i = next(x for x in get(url + "/v1/issues?job=job-loop") if x["id"] == issue["id"])  # type: ignore[union-attr]
                if (i["state"] == "recovered") == lifted and i["recovery"] and not i["alert_dirty"]:
                    break
                time.sleep(0.5)
            rec = i["recovery"]
            job = get(url + "/v1/jobs/" + i["job_id"])                  # the whole story, said on failure
            why = json.dumps({"issue": {k: i[k] for k in ("state", "recovery", "history")},
                              "windows": [(w["start_step"], w["end_step"], w["trigger"]) for w in job["windows"]],  # type: ignore[call-overload,index]
                              "steps": [(s["first_step"], s["last_step"], s["median_seconds"]) for s in job["steps"]]})  # type: ignore[call-overload,index]
            assert am.got, "no alert reached the receiver"
            labels = {json.dumps(x[0]["labels"], sort_keys=True) for x in am.got}
            assert len(labels) == 1 and am.got[0][0]["labels"]["root_cause"] == "dataloader_stall"   # one alert
            if lifted:
                assert i["state"] == "recovered", why
                assert rec["recovered"] and rec["accelerator_hours"] > 0
                assert rec["slow_seconds"] > rec["healthy_seconds"]
                # the stall began at step 25: the series' last healthy summary ends within the 20 steps
                # before it, and the detector opened its window within a few summaries of that
                assert 5 <= rec["onset_after_step"] < 25 and 0 < rec["seconds_to_detect"] < 120, rec
                assert [h["state"] for h in i["history"]] == ["open", "acknowledged", "linked", "recovered"]
                assert am.got[-1][0]["annotations"]["state"] == "recovered"            # the alert resolved
                week = get(url + "/v1/summary?days=7")
                assert isinstance(week, dict) and (week["slowdowns"], week["fixed"]) == (1, 1), week
                assert week["median_seconds_to_localize"] > 0 and week["accelerator_hours_recovered"] > 0
                assert week["median_seconds_to_detect"] == rec["seconds_to_detect"]
                print("the week's numbers:", json.dumps(week), "recovery:", json.dumps(rec), "story:", why)
            else:
                assert i["state"] == "linked" and rec is not None and rec["recovered"] is False, why
                assert am.got[-1][0]["annotations"]["state"] != "recovered"
                # the job ended still slow: its rank 0 said so, and the alert resolved as ended, not fixed
                assert am.got[-1][0]["annotations"]["job_ended"] == "by job", am.got[-1]
    finally:
        am.close()
