"""Documents are the interface: the service diagnoses a window from its documents and the stored
history summaries of the job's earlier windows (never their documents, never a directory), and
says what `eroica diagnose` says of the same run directory."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import AUTH, ROOT

from eroica.engine.pipeline import diagnose
from eroica.schema.diagnosis import WindowHistory


def window_docs(inc: str, window: str) -> list[bytes]:
    return [f.read_bytes() for f in sorted((ROOT / "incidents" / inc / "patterns" / window).glob("rank-*.json"))]


def upload_and_wait(c: TestClient, job: str, docs: list[bytes], n_windows: int) -> dict:  # type: ignore[type-arg]
    for d in docs:
        r = c.post("/v1/patterns", content=gzip.compress(d),
                   headers={**AUTH, "X-Eroica-Job": job, "Content-Encoding": "gzip"})
        assert r.status_code == 201, r.text
    t0 = time.time()
    while time.time() - t0 < 90:
        j = c.get(f"/v1/jobs/{job}").json()
        if len(j["windows"]) == n_windows and all(w["status"] == "done" for w in j["windows"]):
            return j  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"not diagnosed: {j}")


@pytest.mark.parametrize("inc", ["INC-0039", "INC-0042"])
def test_a_later_window_reads_the_earlier_ones_summaries_and_concludes_what_the_run_directory_does(
        client: TestClient, inc: str) -> None:
    windows = sorted(p.name for p in (ROOT / "incidents" / inc / "patterns").iterdir())
    assert len(windows) == 2
    for k, w in enumerate(windows, 1):                 # one window after the other, as a job sends them
        j = upload_and_wait(client, inc.lower(), window_docs(inc, w), k)
    by_id = {w["window_id"]: w for w in j["windows"]}
    served = client.get(f"/v1/windows/{by_id[windows[1]]['pk']}/diagnosis").json()["windows"][0]
    offline = {w.window: w for w in diagnose(ROOT / "incidents" / inc).windows}[windows[1]]
    assert [(f["root_cause"], f["ranks"]) for f in served["findings"]] == [
        (f.root_cause, f.ranks) for f in offline.findings]
    assert [f["confidence"] for f in served["findings"]] == [f.confidence for f in offline.findings]
    # the summary it carries for the windows after it
    h = WindowHistory.model_validate(served["history"])
    assert (h.window, h.start_step) == (windows[1], offline.start_step)
    if inc == "INC-0039":       # rank 3's pinning was there while the job was healthy: not the cause
        assert [(d.rank, d.key) for d in h.config_deviations] == [(3, "cpu.affinity_count")]
        assert served["findings"][0]["root_cause"] == "cpu_contention"
        assert "framework_config" not in {f["root_cause"] for f in served["findings"]}


def test_the_worker_reads_no_earlier_documents_and_writes_no_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker function on its own: documents in, diagnosis out; nothing on disk."""
    import tempfile

    from eroica.service import worker

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    early = WindowHistory(window="w000-s15", start_step=15, job_step_seconds=0.05, config_deviations=[
        {"rank": 3, "key": "cpu.affinity_count", "value": "1", "peer_value": "2"}])
    text = worker.diagnose_window("w001-s56", window_docs("INC-0039", "w001-s56"), None, [early.model_dump_json()],
                                  [])
    assert list(tmp_path.iterdir()) == []
    from eroica.schema.diagnosis import Diagnosis

    (wd,) = Diagnosis.model_validate_json(text).windows
    assert wd.window == "w001-s56" and wd.findings[0].root_cause == "cpu_contention"
    # the summary counted as history: the affinity it showed while the job was faster is no cause now ...
    assert not any(f.root_cause == "framework_config" and f.confidence >= 0.5 for f in wd.findings)
    # ... and it saw the job before the contention began: not a window the contention failed to recur in
    assert wd.findings[0].confidence_factors.windows_total == 1
