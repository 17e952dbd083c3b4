"""Hangs through the service: each rank's snapshot is posted while the job waits; the API stores it,
the diagnosis worker localizes the hang on the snapshots the service has (before any window), the
verdict is stored once and served from the store, and a confirmed one opens the culprit's issue
(and so its alert); a suspected one only when the service is told to."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import AUTH, BACKWARD, LOADER, PG, PG_WHY, TORCH_WAIT


def snap(rank: int, seq: int, stack: list[dict[str, Any]], **kw: Any) -> bytes:
    return json.dumps({"schema": "eroica.hang/v1", "rank": rank, "world_size": 4, "wall_time": 1000.0 + rank,
                       "host": "node-1", "last_step": 30, "stalled_seconds": 5.0, "limit_seconds": 4.0,
                       "stack": stack, "seq": seq, "last_entered": None, "last_completed": None, "error": None,
                       "nics": {"eth0": {"operstate": "up"}}, "peers": {}, **kw}).encode()


def verdict(client: TestClient, url: str, ok: Callable[[dict[str, Any]], bool] = lambda h: True,
            seconds: float = 60.0) -> dict[str, Any]:
    """The stored verdict once the worker has made one of every snapshot posted (and `ok` holds)."""
    deadline, h = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        r = client.get(url, headers=AUTH)
        if r.status_code == 200:
            h = r.json()
            if not h["pending"] and ok(h):
                return h  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"no verdict at {url} after {seconds} s: {h}")


def test_the_service_localizes_a_hang_from_the_ranks_snapshots_and_opens_its_issue(client: TestClient) -> None:
    url = "/v1/jobs/job-h/hang"
    assert client.get(url, headers=AUTH).status_code == 404
    r = client.post(url, content=snap(0, 96, [TORCH_WAIT, BACKWARD]), headers=AUTH)
    assert r.status_code == 201 and r.json()["verdict"] == url
    assert verdict(client, url)["root_cause"] == "hang_unknown"          # one rank: nobody apart
    for rank, body in ((1, snap(1, 94, LOADER)), (2, snap(2, 96, [TORCH_WAIT, BACKWARD])),
                       (3, snap(3, 96, [TORCH_WAIT, BACKWARD]))):
        assert client.post(url, content=body, headers=AUTH).status_code == 201, rank
    h = verdict(client, url)
    assert (h["root_cause"], h["ranks"], h["where"]["function"], h["state"]) == (
        "hang_dataloader", [1], "collate", "confirmed")
    (issue,) = [i for i in client.get("/v1/issues?job=job-h", headers=AUTH).json()]
    assert (issue["root_cause"], issue["ranks"], issue["state"]) == ("hang_dataloader", "1", "open")
    # and the job is hung for Prometheus: a series of its own while it is (deploy/prometheus/eroica-rules.yml)
    line = next(ln for ln in client.get("/metrics").text.splitlines() if ln.startswith("eroica_job_stalled_seconds{"))
    assert 'eroica_job="job-h"' in line and 'state="confirmed"' in line and 'root_cause="hang_dataloader"' in line
    assert 'ranks="1"' in line and float(line.split()[-1]) >= 5.0
    # a second snapshot of the same rank replaces the first; the issue stays one
    assert client.post(url, content=snap(1, 94, LOADER), headers=AUTH).status_code == 201
    verdict(client, url)
    assert len(client.get("/v1/issues?job=job-h", headers=AUTH).json()) == 1


def test_a_bad_snapshot_is_refused_naming_the_field(client: TestClient) -> None:
    url = "/v1/jobs/job-h/hang"
    r = client.post(url, content=b"{", headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (400, "body")          # not JSON: as for a pattern document
    bad = json.loads(snap(0, 1, []))
    bad["rank"] = 9
    r = client.post(url, content=json.dumps(bad).encode(), headers=AUTH)
    assert r.status_code == 422 and "rank" in r.text
    assert client.post(url, content=snap(0, 1, []), headers={}).status_code == 401


SITE_HANG_RULE = """schema: eroica.rule/v1
id: site.collate-event
title: Our collate waits on an event the producer never sets
status: experimental
severity: high
taxonomy: hang_collate_event
owner: site-sre
when:
  - {fact: hang_state, as: h, where: {rank: $rank, state: before_collective, in_data_loader: true}}
emit:
  confidence: 0.95
  function: $h.function
  summary: Rank {h.rank} waits in {h.function} for our producer's event.
tests:
  - name: fires on a rank stuck in the loader before the collective
    given: [{kind: hang_state, rank: 1, state: before_collective, in_data_loader: true, function: collate}]
    expect: [{rank: 1, root_cause: hang_collate_event, function: collate}]
  - name: quiet outside the loader
    given: [{kind: hang_state, rank: 1, state: before_collective, in_data_loader: false, function: collate}]
    expect: []
"""


def test_the_service_localizes_hangs_with_the_site_knowledge_it_diagnoses_windows_with(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same layers as every window: the site's hang rule and root cause, its override of a shipped
    rule (disabled, with a reason), on the snapshots the service receives."""
    from service_support import LOCAL, TOKEN

    from eroica.service.app import Settings, create_app

    site = tmp_path / "site"
    (site / "rules").mkdir(parents=True)
    (site / "overrides").mkdir()
    (site / "rules" / "collate_event.yaml").write_text(SITE_HANG_RULE)
    (site / "taxonomy.yaml").write_text("root_causes:\n  hang_collate_event: {category: software, component: "
                                        "our data producer, question: Does collate wait on our producer?, "
                                        "runbook: runbooks/hang.md}\n")
    (site / "overrides" / "o.yaml").write_text(
        "overrides:\n  hang.dataloader: {disabled: true, reason: our own rule names the producer}\n")
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'e.db'}", token=TOKEN, grace_seconds=1.0,
                              poll_seconds=0.1, knowledge_dirs=[str(site)]))
    with TestClient(app, base_url=LOCAL) as client:
        url = "/v1/jobs/job-s/hang"
        for body in (snap(0, 96, [TORCH_WAIT, BACKWARD]), snap(1, 94, LOADER), snap(2, 96, [TORCH_WAIT, BACKWARD]),
                     snap(3, 96, [TORCH_WAIT, BACKWARD])):
            assert client.post(url, content=body, headers=AUTH).status_code == 201
        h = verdict(client, url)
        assert (h["root_cause"], h["ranks"], h["where"]["function"]) == ("hang_collate_event", [1], "collate")


SUSPECTED = {"state": "suspected", "stalled_seconds": 22.0, "limit_seconds": 300.0, "suspect_after_seconds": 20.0,
             "longest_pause_seconds": 0.4, "longest_pause_step": 3}


def hung_job(client: TestClient, job: str, **kw: Any) -> str:
    url = f"/v1/jobs/{job}/hang"
    for body in (snap(0, 96, [TORCH_WAIT, BACKWARD], **kw), snap(1, 94, LOADER, **kw),
                 snap(2, 96, [TORCH_WAIT, BACKWARD], **kw), snap(3, 96, [TORCH_WAIT, BACKWARD], **kw)):
        assert client.post(url, content=body, headers=AUTH).status_code == 201
    return url


def test_a_suspected_hang_is_a_finding_and_opens_no_issue_until_confirmed(client: TestClient) -> None:
    """22 s without a step in a job whose longest pause was 0.4 s: a finding (>= 0.5) naming the rank and
    the kind, stored as suspected; the issue (and the alert) waits for the confirmation by default."""
    url = hung_job(client, "job-sus", **SUSPECTED)
    h = verdict(client, url)
    assert (h["state"], h["root_cause"], h["ranks"]) == ("suspected", "hang_dataloader", [1])
    assert h["confidence"] >= 0.5 and h["pause_factor"] == 1.0 and h["rule_id"] == "hang.dataloader"
    assert client.get("/v1/issues?job=job-sus", headers=AUTH).json() == []
    page = client.get("/jobs/job-sus", headers=AUTH).text                 # the job's page says it too
    assert "Hang: suspected" in page and "hang_dataloader" in page and "pause 1.00" in page
    confirmed = {**SUSPECTED, "state": "confirmed", "stalled_seconds": 301.0, "wall_time": 1001.0 + 279.0}
    assert client.post(url, content=snap(1, 94, LOADER, **confirmed), headers=AUTH).status_code == 201
    assert verdict(client, url, lambda h: h["state"] == "confirmed")["ranks"] == [1]
    (issue,) = client.get("/v1/issues?job=job-sus", headers=AUTH).json()
    assert (issue["root_cause"], issue["ranks"]) == ("hang_dataloader", "1")


def test_a_suspicion_that_resolves_is_stored_resolved_and_a_long_pause_stays_a_low_suspicion(
        client: TestClient) -> None:
    """In a job that checkpoints for 60 s, 22 s without a step is a low suspicion; when the ranks step
    again the verdict says resolved and how long the stall lasted; no issue either way."""
    url = hung_job(client, "job-ckpt", **{**SUSPECTED, "longest_pause_seconds": 60.0})
    h = verdict(client, url)
    assert h["state"] == "suspected" and h["confidence"] < 0.5 and h["pause_factor"] == 0.3, h
    resolved = {**SUSPECTED, "longest_pause_seconds": 60.0, "state": "resolved", "resolved_wall_time": 1003.0,
                "resolved_after_seconds": 25.0, "resumed_step": 31}
    hung_job(client, "job-ckpt", **resolved)
    h = verdict(client, url, lambda h: h["state"] == "resolved")
    assert h["resolved_after_seconds"] == 25.0 and "Resolved" not in h["summary"]
    assert client.get("/v1/issues?job=job-ckpt", headers=AUTH).json() == []


def test_told_to_the_service_alerts_on_a_confident_suspicion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from service_support import LOCAL, TOKEN

    from eroica.service.app import Settings, create_app

    with pytest.raises(ValueError, match="hang_alert_on"):
        Settings(db_url="sqlite://", hang_alert_on="maybe")
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'e.db'}", token=TOKEN, poll_seconds=0.1,
                              hang_alert_on="suspected"))
    with TestClient(app, base_url=LOCAL) as client:
        verdict(client, hung_job(client, "job-early", **SUSPECTED))
        (issue,) = client.get("/v1/issues?job=job-early", headers=AUTH).json()
        assert (issue["root_cause"], issue["ranks"], issue["state"]) == ("hang_dataloader", "1", "open")
        # the job stepped again (a long checkpoint, not a hang): the issue closes, and its alert resolves
        url = hung_job(client, "job-early", **{**SUSPECTED, "state": "resolved", "resolved_wall_time": 1010.0,
                                               "resolved_after_seconds": 32.0, "resumed_step": 31})
        assert verdict(client, url, lambda h: h["state"] == "resolved")["resolved_after_seconds"] == 32.0
        (issue,) = client.get("/v1/issues?job=job-early", headers=AUTH).json()
        assert issue["state"] == "recovered" and "stepped again after 32 s" in issue["history"][-1]["why"]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(not PG,
                                                                                               reason=PG_WHY))])
def test_two_replicas_localize_each_change_of_a_hang_once(tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    """Snapshots stored through one replica; whichever replica's worker claims the job localizes it,
    and the verdict of the last change is stored once for both to serve."""
    import sqlalchemy as sa
    from service_support import database

    from eroica.service import hangs as service_hangs
    from eroica.service.app import Service, Settings
    from eroica.service.db import hang_verdicts

    with database(kind, tmp_path) as url:
        a = Service(Settings(db_url=url, poll_seconds=0.05, name="replica-a"))
        b = Service(Settings(db_url=url, poll_seconds=0.05, name="replica-b"))
        a.start()
        b.start()
        try:
            for body in (snap(0, 96, [TORCH_WAIT, BACKWARD]), snap(1, 94, LOADER), snap(2, 96, [TORCH_WAIT, BACKWARD]),
                         snap(3, 96, [TORCH_WAIT, BACKWARD])):
                service_hangs.add(a.eng, "job-r", service_hangs.parse(body))
            deadline, f, pending = time.time() + 90, None, True
            while time.time() < deadline and (f is None or pending):
                f, pending = service_hangs.current(b.eng, "job-r")
                time.sleep(0.1)
            assert f is not None and not pending and (f.root_cause, f.ranks) == ("hang_dataloader", [1])
            with a.eng.connect() as c:
                row = c.execute(sa.select(hang_verdicts)).one()
            assert (row.version, row.done_version, row.claimed_by) == (4, 4, None)
        finally:
            a.stop()
            b.stop()
