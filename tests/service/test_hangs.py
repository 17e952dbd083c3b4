"""Hangs through the service: each rank's snapshot is posted while the job waits; the service
localizes the hang on the snapshots it has and opens the culprit's issue (and so its alert)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from service_support import AUTH

TORCH_WAIT = {"file": "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", "line": 979,
              "function": "_engine_run_backward", "code": ""}
BACKWARD = {"file": "/job/train.py", "line": 40, "function": "main", "code": "loss.backward()"}
LOADER = [{"file": "/job/data.py", "line": 12, "function": "collate", "code": "ev.wait()"},
          {"file": "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "line": 700,
           "function": "__next__", "code": ""}]


def snap(rank: int, seq: int, stack: list[dict[str, Any]]) -> bytes:
    return json.dumps({"schema": "eroica.hang/v1", "rank": rank, "world_size": 4, "wall_time": 1000.0 + rank,
                       "host": "node-1", "last_step": 30, "stalled_seconds": 5.0, "limit_seconds": 4.0,
                       "stack": stack, "seq": seq, "last_entered": None, "last_completed": None, "error": None,
                       "nics": {"eth0": {"operstate": "up"}}, "peers": {}}).encode()


def test_the_service_localizes_a_hang_from_the_ranks_snapshots_and_opens_its_issue(client: TestClient) -> None:
    url = "/v1/jobs/job-h/hang"
    assert client.get(url, headers=AUTH).status_code == 404
    r = client.post(url, content=snap(0, 96, [TORCH_WAIT, BACKWARD]), headers=AUTH)
    assert r.status_code == 201 and r.json()["hang"]["root_cause"] == "hang_unknown"   # one rank: nobody apart
    for rank, body in ((1, snap(1, 94, LOADER)), (2, snap(2, 96, [TORCH_WAIT, BACKWARD])),
                       (3, snap(3, 96, [TORCH_WAIT, BACKWARD]))):
        assert client.post(url, content=body, headers=AUTH).status_code == 201, rank
    h = client.get(url, headers=AUTH).json()
    assert (h["root_cause"], h["ranks"], h["where"]["function"]) == ("hang_dataloader", [1], "collate")
    (issue,) = [i for i in client.get("/v1/issues?job=job-h", headers=AUTH).json()]
    assert (issue["root_cause"], issue["ranks"], issue["state"]) == ("hang_dataloader", "1", "open")
    # a second snapshot of the same rank replaces the first; the issue stays one
    assert client.post(url, content=snap(1, 94, LOADER), headers=AUTH).status_code == 201
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
        h = client.get(url, headers=AUTH).json()
        assert (h["root_cause"], h["ranks"], h["where"]["function"]) == ("hang_collate_event", [1], "collate")
