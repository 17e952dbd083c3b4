"""Runtime control of a real running 4-rank job: a window asked for through the control file opens
on every rank at the same step; a policy change published straight to the job's torch.distributed
store is applied by every rank; both are logged with who asked."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from eroica.cli.main import main
from eroica.lab.launch import free_port, launch
from eroica.schema.patterns import PatternsDoc

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def wait_for(path: Path, text: str, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_a_window_on_request_and_a_policy_change_through_the_store(tmp_path: Path) -> None:
    port = free_port()
    result = {}
    job = threading.Thread(target=lambda: result.setdefault("r", launch(
        tmp_path, steps=200, master_port=port, progress=False, extra_args=["--stop-after-windows", "99"],
        env={"EROICA_POLICY_THRESHOLD_MIN_RATIO": "50", "EROICA_POLICY_SUSTAINED_MIN_RATIO": "50"})))
    job.start()
    try:
        wait_for(tmp_path / "logs" / "rank-0.log", "step 20:")
        assert main(["control", str(tmp_path), "--who", "alice", "--window-now", "--note", "INC-42"]) == 0
        wait_for(tmp_path / "control.log.jsonl", '"who": "alice"')
        assert main(["control", str(tmp_path), "--who", "bob", "--store", f"127.0.0.1:{port}",
                     "--set", "cooldown_steps=7", "--set", "window_steps=6"]) == 0
        wait_for(tmp_path / "control.log.jsonl", '"who": "bob", "at"')
    finally:
        job.join(300)
    res = result["r"]
    assert res.ok, res.logs
    log = [json.loads(x) for x in (tmp_path / "control.log.jsonl").read_text().splitlines()]
    applied = [x for x in log if x["result"] == "applied"]
    assert [x["who"] for x in applied] == ["alice", "bob"]
    assert any(x["who"] == "bob" and x["result"].startswith("published through the store") for x in log)
    (wdir,) = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("w")]
    docs = [PatternsDoc.model_validate_json((wdir / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {d.window.trigger for d in docs} == {"requested"}
    assert len({d.window.start_step for d in docs}) == 1 and docs[0].window.start_step > applied[0]["step"]
    for d in docs:                         # every rank applied both changes (rank 0 logged them)
        cfg = {c.key: c.value for c in d.config}
        assert "by alice" in cfg["eroica.control"]
