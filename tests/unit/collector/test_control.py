"""Runtime control: requests in RUN_DIR/control.jsonl or through the store, applied by every rank
at the same step, logged with who and when; bad requests are rejected and logged, never raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eroica.cli.main import main
from eroica.collector import Monitor, TriggerPolicy
from eroica.collector.control import (
    ControlChange,
    ControlReader,
    ControlRequest,
    RequestFile,
    append_request,
    apply_change,
    publish,
)
from eroica.collector.sync import LocalStore
from eroica.schema.patterns import PatternsDoc

torch = pytest.importorskip("torch")
POLICY = TriggerPolicy(control_poll_steps=2, control_lead_steps=4, window_steps=3, lead_steps=7)


def test_a_published_change_reaches_every_reader_once_in_order() -> None:
    store = LocalStore()
    readers = [ControlReader(store) for _ in range(3)]
    a = publish(store, ControlRequest(who="alice", enable=False), 40)
    b = publish(store, ControlRequest(who="bob", window_now=True), 44)
    assert (a.seq, b.seq) == (1, 2)
    for r in readers:
        assert [c.request.who for c in r.poll()] == ["alice", "bob"]
        assert r.poll() == []
    store.add("eroica/control/seq", 1)           # numbered, body not written yet: wait, do not skip
    assert readers[0].poll() == [] and readers[0].seen == 2


def test_the_request_file_yields_complete_new_lines_and_names_a_bad_one(tmp_path: Path) -> None:
    watch = RequestFile(tmp_path / "control.jsonl")
    assert watch.new_requests() == []                  # no file yet
    append_request(tmp_path, ControlRequest(who="alice", policy={"threshold_min_ratio": 1.3}))
    with open(tmp_path / "control.jsonl", "a") as fh:
        fh.write('{"who": "mallory", "policy": {}, "shell": "rm -rf /"}\n{"who": "half-writ')
    got = watch.new_requests()
    assert got[0][0] is not None and got[0][0].policy == {"threshold_min_ratio": 1.3}
    assert got[1][0] is None and "control.jsonl:2: field shell" in got[1][1]
    assert len(got) == 2 and watch.new_requests() == []   # the half-written line waits for its newline
    with open(tmp_path / "control.jsonl", "a") as fh:
        fh.write('ten"}\n')
    (req, _), = watch.new_requests()
    assert req is not None and req.who == "half-written"


def test_a_change_that_does_not_validate_leaves_the_policy_as_it_was() -> None:
    bad = ControlChange(seq=1, effective_step=0, request=ControlRequest(who="a", policy={"window_steps": 1}))
    policy, result = apply_change(POLICY, bad)
    assert policy is POLICY and result.startswith("rejected: field window_steps")
    cross = ControlChange(seq=2, effective_step=0, request=ControlRequest(who="a", policy={"lead_steps": 2}))
    assert apply_change(POLICY, cross)[1].startswith("rejected: field (policy)")   # lead < poll + 2
    ok = ControlChange(seq=3, effective_step=0, request=ControlRequest(who="a", enable=False))
    assert apply_change(POLICY, ok) == (POLICY.model_copy(update={"enabled": False}), "applied")


def run(mon: Monitor, steps: int) -> None:
    import time

    model = torch.nn.Linear(16, 16)
    for _ in range(steps):
        model(torch.randn(8, 16)).sum().backward()
        time.sleep(0.005)          # a step takes time: the store worker answers within one
        mon.step()


def test_a_running_monitor_applies_file_requests_at_their_step_and_logs_them(tmp_path: Path) -> None:
    mon = Monitor(out_dir=tmp_path, policy=POLICY)
    run(mon, 3)
    assert main(["control", str(tmp_path), "--who", "alice", "--disable", "--set", "threshold_min_ratio=1.4"]) == 0
    assert main(["control", str(tmp_path), "--who", "bob", "--window-now", "--note", "INC-1"]) == 0
    with open(tmp_path / "control.jsonl", "a") as fh:
        fh.write("not json\n")
    run(mon, 4)            # step 4: rank 0 reads the file and publishes both for step 4 + 4 = 8
    assert mon.policy.enabled
    run(mon, 1)            # step 8: applied
    assert not mon.policy.enabled and mon.policy.threshold_min_ratio == 1.4
    run(mon, 12)           # the requested window: planned at 8 + lead 7 = 15, three steps long
    mon.close()
    doc = PatternsDoc.model_validate_json((tmp_path / "w000-s15" / "rank-0.json").read_text())
    assert doc.window.trigger == "requested" and doc.window.start_step == 15
    assert any(c.key == "eroica.control" and "by bob" in c.value for c in doc.config)
    log = [json.loads(x) for x in (tmp_path / "control.log.jsonl").read_text().splitlines()]
    assert [(x.get("who"), x["result"][:8]) for x in log] == [(None, "rejected"), ("alice", "applied"),
                                                              ("bob", "applied")]
    assert "control.jsonl:3" in log[0]["result"] and log[1]["step"] == 8 and log[2]["request"]["note"] == "INC-1"
    assert main(["control", str(tmp_path), "--show"]) == 0
    # a mistyped run directory is an error, never "no control log yet" with success
    assert main(["control", str(tmp_path / "no-such-run"), "--show"]) == 2
    assert not (tmp_path / "no-such-run").exists()


def test_a_broken_store_is_a_gap_not_an_exception(tmp_path: Path) -> None:
    class Broken(LocalStore):
        def add(self, key: str, amount: int) -> int:
            raise TimeoutError("store unreachable")

    mon = Monitor(out_dir=tmp_path, policy=POLICY, store=Broken())
    for _ in range(20):          # the store worker's answer arrives a step or more later; on a loaded host, later
        run(mon, 6)
        if any(g.source == "store.control" for g in mon.gaps):
            break
    mon.close()
    assert not mon.disabled and any(g.source == "store.control" and "unreachable" in g.reason for g in mon.gaps)
