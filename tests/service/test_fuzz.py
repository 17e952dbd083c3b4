"""Fuzzing from the published API: schemathesis reads `eroica serve`'s own OpenAPI document
(`/v1/openapi.json`) and drives a live service over HTTP with generated requests. Whatever it sends:
never a 500, every JSON refusal names its `field` and its `error`, and a refused write stores nothing.

What runs, for every operation of the document (30 today), as two tests:

- `positive`: up to EXAMPLES_PER_ROUTE (100) requests the document allows (schemathesis' positive mode);
- `negative`: up to EXAMPLES_PER_ROUTE requests it does not allow: schemathesis' negative mode where the
  operation has something to get wrong (parameters, a body); for the 8 that have neither (GET /, /hosts,
  /metrics, /healthz, /v1/jobs, /v1/hosts, POST /login, /logout), requests the document does not
  describe, from `unexpected`: unknown query parameters, bodies of any bytes under assorted content
  types and encodings, hostile headers (Host, Origin, session cookies, forwarded-for) and wrong or
  missing credentials.

"Up to": hypothesis stops a test early once it has generated every distinct request it can. Today
every negative test runs 100; so does every positive one but those 8 (1 each: there is nothing to
vary) and GET /v1/drain (3: its one parameter is an enum). `-s` prints how many each ran.

Then `test_following_the_links`, on a fresh service: schemathesis' state machine follows the
document's OpenAPI links (eroica.service.app.LINKS: the jobs -> a job -> its windows, diagnosis,
findings and issues -> acting on an issue; an upload -> its job and window), SCENARIOS scenarios of
at most STEPS calls, each call checked as above, and it must have followed links to real resources
(2xx answers) of several kinds, not just run."""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import sqlalchemy as sa
import uvicorn
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.generation import GenerationMode
from service_support import AUTH, TOKEN, free_port, incident_docs

from eroica.service.app import Settings, create_app
from eroica.service.db import diagnoses, documents, hangs, issues, jobs, steps, windows

EXAMPLES_PER_ROUTE = 100
TABLES = (jobs, windows, documents, diagnoses, issues, steps, hangs)
#: what the dispatcher writes on its own time (a diagnosis, the issue it opens): no request does, and an earlier
#: accepted one may lead to a row at any moment
BACKGROUND = ("diagnoses", "issues")
SCENARIOS, STEPS = 100, 10         # the stateful run: scenarios of at most this many calls each


class Live:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(Settings(db_url=f"sqlite:///{tmp / 'fuzz.db'}", token=TOKEN, grace_seconds=1,
                                       poll_seconds=0.1, max_body_bytes=1_000_000))
        self.eng = self.app.state.svc.eng
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.http = requests.Session()     # one connection pool for all the requests sent

    def counts(self) -> dict[str, int]:
        with self.eng.connect() as c:
            return {t.name: int(c.execute(sa.select(sa.func.count()).select_from(t)).scalar()) for t in TABLES}


@contextlib.contextmanager
def started(tmp: Path) -> Iterator[Live]:
    """A live service with a job, a window and its issue to fuzz against."""
    live = Live(tmp)
    live.thread.start()
    while not live.server.started:
        time.sleep(0.05)
    for d in incident_docs("INC-0017"):
        req = urllib.request.Request(live.url + "/v1/patterns", data=gzip.compress(d), method="POST",
                                     headers={**AUTH, "X-Eroica-Job": "job-1", "Content-Encoding": "gzip",
                                              "Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
    deadline = time.time() + 60
    while time.time() < deadline and not live.counts()["issues"]:
        time.sleep(0.2)
    assert live.counts()["issues"], "the seeded window was not diagnosed into an issue"
    try:
        yield live
    finally:
        live.http.close()
        live.server.should_exit = True
        live.thread.join(10)


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with started(tmp_path_factory.mktemp("fuzz")) as live:
        yield live


def load(live: Live) -> Any:
    return schemathesis.openapi.from_url(live.url + "/v1/openapi.json", headers=AUTH)


@pytest.fixture(scope="module")
def api(live_service: Live) -> Any:
    return load(live_service)


def _operations() -> list[tuple[str, str, bool]]:
    """Every (method, path) of the published document (read from the app itself, offline), and whether
    it has parameters or a body for schemathesis' negative mode to get wrong."""
    doc = create_app(Settings(db_url="sqlite://"), start=False).openapi()
    return [(m.upper(), p, bool(op.get("parameters") or op.get("requestBody")))
            for p, ops in doc["paths"].items() for m, op in ops.items()]


OPERATIONS = _operations()
CASES = [(m, p, mode) for m, p, _ in OPERATIONS for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]


def content_type(response: Any) -> str:
    got = response.headers.get("content-type") or response.headers.get("Content-Type") or [""]
    return str(got[0] if isinstance(got, list) else got)


def sent(case: Any) -> str:
    """What a failing request was (curl's line hides the credentials and cookies, so its headers too)."""
    return f"{case.as_curl_command()}\n  headers: {dict(case.headers or {})!r}"


def check(case: Any, live: Live) -> Any:
    """Send `case` (with the service token unless the case says otherwise) and check what came back."""
    before = live.counts() if case.method.upper() == "POST" else {}
    response = case.call(base_url=live.url, headers={**AUTH, **(case.headers or {})}, timeout=30,
                         session=live.http)
    live.http.cookies.clear()             # a session cookie /login set is not sent on
    assert response.status_code < 500, (sent(case), response.text[:300])   # whatever was sent
    if 400 <= response.status_code < 500 and content_type(response).startswith("application/json"):
        body = response.json()
        assert body.get("field") and body.get("error"), (sent(case), body)  # every refusal names its field
    if 400 <= response.status_code < 500 and before:
        after = live.counts()
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k] and k not in BACKGROUND}
        assert not changed, (sent(case), changed)       # a refused write stores nothing
    return response


# ------------------------------------------------------------------ what the document does not describe
# header values requests (and the wire) can carry: Latin-1 without control characters, no edge whitespace
TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40
               ).map(str.strip)
DIGITS = st.text("0123456789\u00b2\u00b3\u00b9", min_size=1, max_size=12)    # and the digits that are not ASCII
JSON = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                 max_size=4), max_leaves=12)
PATHS = st.sampled_from(["/", "//evil.example", "/\\evil.example", "http://evil.example/", "/jobs/job-1", ""])
FORM = st.dictionaries(st.sampled_from(["token", "next", "back", "action", "who"]) | TEXT,
                       st.sampled_from([TOKEN, TOKEN + "x"]) | PATHS | TEXT, max_size=4)
BODIES = (st.binary(max_size=600)
          | JSON.map(lambda v: json.dumps(v).encode())
          | FORM.map(lambda f: "&".join(f"{k}={v}" for k, v in f.items()).encode())
          | JSON.map(lambda v: gzip.compress(json.dumps(v).encode())))
CONTENT_TYPES = st.sampled_from(["application/json", "application/x-www-form-urlencoded", "application/x-ndjson",
                                 "text/plain", "text/html; charset=utf-16", "multipart/form-data; boundary=x",
                                 "application/octet-stream", "application/json; charset=latin-1", ""]) | TEXT
CREDENTIALS = (st.none() | st.sampled_from([f"Bearer {TOKEN}x", "Bearer", "Bearer ", f"bearer {TOKEN}", TOKEN])
               | TEXT.map("Bearer {}".format) | TEXT.map("Basic {}".format) | TEXT)
SESSIONS = st.builds("eroica_session={}.{}".format, DIGITS | st.integers(0, 2**40).map(str) | TEXT, TEXT) | TEXT


def headers_for(live: Live) -> st.SearchStrategy[dict[str, Any]]:
    """Assorted hostile headers; a None value leaves the header (the service token too) out."""
    host = f"127.0.0.1:{live.port}"
    return st.fixed_dictionaries({}, optional={
        "Authorization": CREDENTIALS,
        "Cookie": SESSIONS,
        "Content-Type": CONTENT_TYPES | st.none(),
        "Content-Encoding": st.sampled_from(["gzip", "deflate", "br", "identity", "gzip, gzip"]) | TEXT,
        "Host": st.sampled_from([host, "evil.example", "127.0.0.1.evil.example", "[::1]:1", "localhost:0"]) | TEXT,
        "Origin": st.sampled_from([f"http://{host}", "http://evil.example", "null", f"https://{host}"]) | TEXT,
        "Sec-Fetch-Site": st.sampled_from(["cross-site", "same-site", "same-origin", "none"]) | TEXT,
        "X-Forwarded-For": TEXT, "X-Forwarded-Proto": st.sampled_from(["https", "http"]) | TEXT,
        "X-Eroica-Job": TEXT, "X-Eroica-Job-Name": TEXT, "Accept": TEXT, "Accept-Encoding": TEXT,
    })


def unexpected(op: Any, live: Live) -> st.SearchStrategy[Any]:
    """Requests to `op` that its document does not describe (it declares no input to get wrong)."""
    query = st.dictionaries(st.sampled_from(["next", "format", "limit", "job", "state", "days", "token"]) | TEXT,
                            TEXT, max_size=4)

    def case(q: dict[str, str], h: dict[str, Any], body: bytes | None) -> Any:
        if body is None:
            return op.Case(query=q, headers=h)
        return op.Case(query=q, headers=h, body=body, media_type="application/octet-stream")
    return st.builds(case, query, headers_for(live), st.none() | BODIES)


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {g.value}" for m, p, g in CASES])
def test_no_request_the_schema_allows_or_forbids_gets_a_500_or_a_silent_refusal(
        api: Any, live_service: Live, method: str, path: str, mode: GenerationMode) -> None:
    op = api[path][method]
    described = next(d for m, p, d in OPERATIONS if (m, p) == (method, path))
    strategy = (op.as_strategy(generation_mode=mode) if mode == GenerationMode.POSITIVE or described
                else unexpected(op, live_service))
    ran = 0

    @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def fuzz(case: Any) -> None:
        nonlocal ran
        ran += 1
        check(case, live_service)
    fuzz()
    print(f"{method} {path} {mode.value}: {ran} examples")


#: links the stateful run must have followed to a resource (2xx): the fleet's jobs -> a job -> its windows'
#: diagnosis and its findings; and acting on an issue the issues' list names (refused or not: it is the issue's state)
REACHED = {"GET /v1/jobs -> [200] Job -> GET /v1/jobs/{job_id}",
           "GET /v1/jobs/{job_id} -> [200] Diagnosis -> GET /v1/windows/{pk}/diagnosis",
           "GET /v1/jobs/{job_id} -> [200] Findings -> GET /v1/findings"}
WALKED = {"GET /v1/issues -> [200] Act -> POST /v1/issues/{iid}/{action}"}


def test_following_the_links(tmp_path: Path) -> None:
    """schemathesis' state machine over the document's links (none inferred), on a service of its own
    (the fuzzing above moves the seeded issue through its lifecycle); every call checked as above."""
    followed: Counter[tuple[str, int]] = Counter()     # (link, status) of each call a link gave its values to
    failed: list[BaseException] = []
    scenarios, runs = 0, 0
    with started(tmp_path) as live:
        schema = load(live)
        schema.config.phases.stateful.inference.algorithms = []

        class Workflow(schema.as_state_machine()):  # type: ignore[misc]
            def step(self, input: Any) -> Any:
                out = super().step(input)
                if input.transition is not None and input.is_applied:
                    followed[(input.transition.id, out.response.status_code // 100 * 100)] += 1
                return out

            def call(self, case: Any, **kwargs: Any) -> Any:
                try:
                    return check(case, live)
                except AssertionError as exc:
                    failed.append(exc)
                    raise

            def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
                pass          # what check() asserts, nothing else

            def teardown(self) -> None:
                nonlocal scenarios
                scenarios += 1

        while scenarios < SCENARIOS and runs < 5:
            # a live service answers a replayed prefix otherwise once its state moved on (an issue acknowledged, a
            # job created): hypothesis calls that a flaky strategy, and schemathesis' own runner starts another
            # run, as this does (a check that failed is never passed over: `failed` keeps it)
            runs += 1
            try:
                seed(runs)(Workflow).run(settings=settings(
                    max_examples=SCENARIOS - scenarios, stateful_step_count=STEPS, deadline=None, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
            except FlakyStrategyDefinition:
                continue
    assert not failed, failed[0]
    reached = {link for (link, status) in followed if status == 200}
    print(f"{scenarios} scenarios in {runs} runs; links followed in {sum(followed.values())} calls, "
          f"{len(reached)} links to a resource:")
    for (link, status), n in sorted(followed.items()):
        print(f"  {n:4d} x {status // 100}xx  {link}")
    assert sum(n for (_, status), n in followed.items() if status == 200) >= 50, followed
    assert len(reached) >= 7 and REACHED <= reached, followed
    assert WALKED <= {link for link, _ in followed}, followed
