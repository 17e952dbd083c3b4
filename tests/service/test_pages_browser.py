"""The service's pages in a real headless browser (Debian's chromium): the fleet and job views load
from a live server with no console errors and no request leaving it; their screenshots are what
docs/service.md shows (docs/serve-fleet.png, docs/serve-job.png)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import uvicorn
from screenshot_support import keep_screenshot
from service_support import AUTH, TOKEN, free_port, incident_docs

from eroica.service.app import Settings, create_app


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _post(url: str, path: str, body: bytes, job: str) -> None:
    req = urllib.request.Request(url + path, data=gzip.compress(body), method="POST",
                                 headers={**AUTH, "X-Eroica-Job": job, "Content-Encoding": "gzip",
                                          "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_fleet_and_job_pages_open_in_a_browser_without_errors_or_outside_requests(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'b.db'}", token=TOKEN, poll_seconds=0.1))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        while not server.started:
            time.sleep(0.05)
        for i, (med, p90) in enumerate([(0.08, 0.09)] * 2 + [(0.19, 0.23)] * 2):
            _post(url, "/v1/jobs/llm-pretrain-7/steps", json.dumps({
                "first_step": 10 + i * 8, "last_step": 17 + i * 8, "median_seconds": med, "p90_seconds": p90,
                "world_size": 4}).encode(), "llm-pretrain-7")
        for inc, job in (("INC-0017", "llm-pretrain-7"), ("INC-0001", "recsys-dlrm-2"), ("INC-0024", "vit-ft-3")):
            for d in incident_docs(inc):
                _post(url, "/v1/patterns", d, job)
        deadline = time.time() + 90
        while time.time() < deadline:
            ws = [w for j in ("llm-pretrain-7", "recsys-dlrm-2", "vit-ft-3")
                  for w in json.loads(urllib.request.urlopen(f"{url}/v1/jobs/{j}").read())["windows"]]
            if all(w["status"] == "done" for w in ws):
                break
            time.sleep(0.3)
        for name, path in (("fleet", "/"), ("job", "/jobs/llm-pretrain-7")):
            shot, netlog = tmp_path / f"{name}.png", tmp_path / f"{name}-net.json"
            cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   # the browser's own form-autofill lookups (the job page has forms) are not the page's requests
                   "--disable-features=AutofillServerCommunication",
                   f"--user-data-dir={tmp_path / ('profile-' + name)}", "--enable-logging=stderr", "--v=0",
                   f"--log-net-log={netlog}", "--window-size=1200,820", f"--screenshot={shot}", url + path]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert shot.exists() and shot.stat().st_size > 10_000, res.stderr[-2000:]
            console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
            assert console == [], console
            events = json.loads(netlog.read_text())["events"]
            urls = {e["params"]["url"] for e in events if "url" in e.get("params", {})
                    and str(e["params"].get("network_isolation_key", "")).startswith("http://127.0.0.1 ")}
            assert urls and all(u.startswith(url + "/") for u in urls), urls   # the page's own origin only
            keep_screenshot(shot, f"serve-{name}.png")
    finally:
        server.should_exit = True
        t.join(10)
