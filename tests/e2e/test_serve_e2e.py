"""End to end, online: `eroica serve` (a real uvicorn server on 127.0.0.1) and a real 4-rank gloo job
with a real fault. The finding must be in the API while the job's ranks are still running, whether
the documents come over HTTP from the collector's sink (no shared directory) or from a watched run
root, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from service_support import PG, PG_WHY, get, postgres, serve
from service_support import SERVE_TOKEN as TOKEN

from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def run_online(tmp: Path, url: str, out: Path, env: dict[str, str]) -> None:
    """The job runs in a thread; the finding has to show up in the API before the job ends."""
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(res=launch(out, fault="dataloader_stall", fault_rank=1,
                                                               fault_step=25, steps=260, env=env, progress=False,
                                                               extra_args=["--stop-after-windows", "100"])))
    t.start()
    found, alive = None, False
    try:
        while t.is_alive() and found is None:
            fs = get(url + "/v1/findings?min_confidence=0.5")
            assert isinstance(fs, list)
            found = next((f for f in fs if f["root_cause"] == "dataloader_stall" and f["ranks"] == [1]), None)
            alive = t.is_alive()
            time.sleep(0.3)
    finally:
        t.join()
    res = box["res"]
    assert res.ok, f"job failed: {res.returncodes}\n" + "\n".join(t[-2000:] for t in res.logs.values())  # type: ignore[attr-defined]
    assert found is not None, f"no dataloader_stall finding while the job ran; got {get(url + '/v1/findings')}"
    assert alive, "the finding arrived only after the job ended"
    page = urllib.request.urlopen(f"{url}/jobs/{found['job_id']}", timeout=5).read().decode()
    assert "dataloader_stall" in page and "full report" in page
    job = get(f"{url}/v1/jobs/{found['job_id']}")
    assert isinstance(job, dict) and job["windows"][0]["seconds_to_diagnosis"] is not None
    assert 0 < job["windows"][0]["seconds_close_to_diagnosis"] < 60


# on a fleet's PostgreSQL; the sink into SQLite runs in tests/e2e/test_loop_e2e.py and the service's load tests
@pytest.mark.parametrize("db", [pytest.param("postgresql", marks=pytest.mark.skipif(not PG, reason=PG_WHY))])
def test_the_sink_ships_the_window_and_the_finding_is_served_while_the_job_runs(tmp_path: Path, db: str) -> None:
    with contextlib.ExitStack() as stack:
        args = ["--db", stack.enter_context(postgres())] if db == "postgresql" else []
        url = stack.enter_context(serve(tmp_path, *args))
        run_online(tmp_path, url, tmp_path / "job-sink", {"EROICA_SINK": url, "EROICA_SINK_TOKEN": TOKEN})
        job = get(f"{url}/v1/jobs/job-sink")
        assert isinstance(job, dict) and job["steps"], "rank 0's step-time summaries did not arrive"
        # the stalled rank's window trace was kept (a suspect) and sent: the job links it, it opens
        kept = [t for w in job["windows"] for t in w["raw_traces"] if t["rank"] == 1]
        assert kept, f"no raw trace of rank 1 at the service: {[w['raw_traces'] for w in job['windows']]}"
        trace = get(url + kept[0]["url"])
        assert isinstance(trace, dict) and trace["traceEvents"]
        assert not list((tmp_path / "job-sink").glob(".spool/*/*.json.gz")), "documents left in the spool"


def test_a_watched_run_root_is_diagnosed_while_the_job_runs(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    with serve(tmp_path, "--watch", str(root)) as url:
        run_online(tmp_path, url, root / "job-watched", {})
        # the stalled rank's kept trace, written beside the window's documents, reaches the job too
        deadline = time.monotonic() + 20
        while not (kept := get(f"{url}/v1/jobs/job-watched/traces")) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert isinstance(kept, dict) and any(t["rank"] == 1 for ts in kept.values() for t in ts), kept
