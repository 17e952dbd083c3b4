"""Fuzzing from the published API: schemathesis reads `eroica serve`'s own OpenAPI document
(`/v1/openapi.json`) and drives every route of a live service over HTTP with generated requests,
valid and invalid, a fixed number per route. Whatever it sends: never a 500, every refusal names its
field, and a refused write stores nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import sqlalchemy as sa
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode
from service_support import AUTH, TOKEN, free_port, incident_docs

from eroica.service.app import Settings, create_app
from eroica.service.db import diagnoses, documents, hangs, issues, jobs, steps, windows

EXAMPLES_PER_ROUTE = 100
TABLES = (jobs, windows, documents, diagnoses, issues, steps, hangs)


class Live:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(Settings(db_url=f"sqlite:///{tmp / 'fuzz.db'}", token=TOKEN, grace_seconds=1,
                                       poll_seconds=0.1, max_body_bytes=1_000_000))
        self.eng = self.app.state.svc.eng
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def counts(self) -> dict[str, int]:
        with self.eng.connect() as c:
            return {t.name: int(c.execute(sa.select(sa.func.count()).select_from(t)).scalar()) for t in TABLES}


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    live = Live(tmp_path_factory.mktemp("fuzz"))
    live.thread.start()
    while not live.server.started:
        time.sleep(0.05)
    import gzip
    import urllib.request
    for d in incident_docs("INC-0017"):               # a job, a window and (soon) its issue to fuzz against
        req = urllib.request.Request(live.url + "/v1/patterns", data=gzip.compress(d), method="POST",
                                     headers={**AUTH, "X-Eroica-Job": "job-1", "Content-Encoding": "gzip",
                                              "Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
    deadline = time.time() + 60
    while time.time() < deadline and not live.counts()["issues"]:
        time.sleep(0.2)
    yield live
    live.server.should_exit = True
    live.thread.join(10)


@pytest.fixture(scope="module")
def api(live_service: Live) -> Any:
    return schemathesis.openapi.from_url(live_service.url + "/v1/openapi.json", headers=AUTH)


def _cases() -> list[tuple[str, str, GenerationMode]]:
    """Every (method, path) the published document has (read from the app itself, offline), with
    valid requests, and with invalid ones where it has something to get wrong (parameters, a body)."""
    doc = create_app(Settings(db_url="sqlite://"), start=False).openapi()
    out = []
    for p, ops in doc["paths"].items():
        for m, op in ops.items():
            out.append((m.upper(), p, GenerationMode.POSITIVE))
            if op.get("parameters") or op.get("requestBody"):
                out.append((m.upper(), p, GenerationMode.NEGATIVE))
    return out


CASES = _cases()


def content_type(response: Any) -> str:
    got = response.headers.get("content-type") or response.headers.get("Content-Type") or [""]
    return str(got[0] if isinstance(got, list) else got)


def check(case: Any, live: Live) -> None:
    before = live.counts()
    response = case.call(base_url=live.url, headers={**AUTH, **(case.headers or {})}, timeout=30)
    assert response.status_code < 500, (case.as_curl_command(), response.text[:300])   # whatever was sent
    if 400 <= response.status_code < 500 and content_type(response).startswith("application/json"):
        body = response.json()
        assert body.get("field") and body.get("error"), (case.as_curl_command(), body)  # every refusal names its field
    if 400 <= response.status_code < 500 and case.method.upper() == "POST":
        after = live.counts()
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k] and k != "diagnoses"}
        assert not changed, (case.as_curl_command(), changed)       # a refused write stores nothing


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {g.value}" for m, p, g in CASES])
def test_no_request_the_schema_allows_or_forbids_gets_a_500_or_a_silent_refusal(
        api: Any, live_service: Live, method: str, path: str, mode: GenerationMode) -> None:
    op = api[path][method]

    @settings(max_examples=EXAMPLES_PER_ROUTE // 2, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def fuzz(case: Any) -> None:
        check(case, live_service)
    fuzz()
