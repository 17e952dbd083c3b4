"""The service's API on a real SQLite database: ingestion, idempotency, the bad-input table (each a
4xx naming the field, nothing partial stored, one log line), auth, and no path reaches the disk."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from polling import until
from service_support import AUTH, LOCAL, changed_doc, incident_docs


def post(c: TestClient, body: bytes, job: str = "job-1", gz: bool = True, auth: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    headers = {**(AUTH if auth is None else auth), "X-Eroica-Job": job}
    if gz:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    return c.post("/v1/patterns", content=body, headers=headers)


def wait_done(c: TestClient, job: str, timeout: float = 60) -> dict:  # type: ignore[type-arg]
    def diagnosed() -> dict | None:  # type: ignore[type-arg]
        j = c.get(f"/v1/jobs/{job}").json()
        return j if j["windows"] and all(w["status"] in ("done", "failed") for w in j["windows"]) else None
    return until(diagnosed, timeout, f"every window of {job} diagnosed")


def test_a_complete_window_is_diagnosed_once_and_a_reupload_changes_nothing(client: TestClient) -> None:
    docs = incident_docs("INC-0017")
    assert [post(client, d).status_code for d in docs] == [201] * 4
    j = wait_done(client, "job-1")
    (w,) = j["windows"]
    assert (w["status"], w["ranks_reported"], w["attempts"]) == ("done", 4, 1)
    fs = client.get("/v1/findings", params={"job": "job-1", "min_confidence": 0.5}).json()
    assert [(f["root_cause"], f["ranks"]) for f in fs][:1] == [("cpu_contention", [2])]
    # the same documents again: acknowledged, nothing new stored, not diagnosed again
    stored = client.get(f"/v1/windows/{w['pk']}").json()["findings"]
    assert [post(client, d).json()["created"] for d in docs] == [False] * 4
    # a re-upload that queued the window again would have set it back to ready in the same request
    w2 = client.get(f"/v1/windows/{w['pk']}").json()
    assert (w2["status"], w2["attempts"], len(w2["findings"])) == ("done", 1, len(stored))
    d = client.get(f"/v1/windows/{w['pk']}/diagnosis").json()
    assert d["schema"] == "eroica.diagnosis/v1" and d["windows"][0]["window"] == w["window_id"]
    text = client.get("/metrics").text
    assert "eroica_documents_ingested_total 4.0" in text and "eroica_windows_diagnosed_total 1.0" in text
    assert 'eroica_findings_total{category="software",root_cause="cpu_contention"} 1.0' in text
    assert "eroica_time_to_diagnosis_seconds_count 1.0" in text


def test_a_window_with_a_missing_rank_is_diagnosed_after_the_grace_period_and_says_who_is_missing(
        client: TestClient) -> None:
    docs = incident_docs("INC-0017")
    for d in docs[:3]:
        assert post(client, d, job="partial").status_code == 201
    j = wait_done(client, "partial")
    d = client.get(f"/v1/windows/{j['windows'][0]['pk']}/diagnosis").json()
    assert d["windows"][0]["coverage"]["ranks_missing"] == [3]


_doc = changed_doc


BAD = [
    # (what, body, job, gzip, auth, status, field)
    ("malformed JSON", b'{"schema": "eroica.patterns/v1", "job": ', "job-1", True, None, 400, "body"),
    ("another schema", _doc(schema="eroica.patterns/v2"), "job-1", True, None, 422, "schema"),
    ("a wrong field type", _doc(window__start_step="soon"), "job-1", True, None, 422, "window.start_step"),
    ("a rank out of range", _doc(job__rank=9), "job-1", True, None, 422, "job.rank"),
    ("a bad job id", _doc(), "../../etc", True, None, 400, "x-eroica-job"),
    ("an oversize body", b"x" * 300_000, "job-1", False, None, 413, "body"),
    ("a gzip bomb", b"{" + b" " * 2_000_000 + b"}", "job-1", True, None, 413, "body"),
    ("not gzip", b"plain", "job-1", "lie", None, 400, "body"),
    ("no token", _doc(), "job-1", True, {}, 401, "authorization"),
    ("a wrong token", _doc(), "job-1", True, {"Authorization": "Bearer nope"}, 401, "authorization"),
]


@pytest.mark.parametrize(("what", "body", "job", "gz", "auth", "status", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_naming_the_field_with_nothing_stored_and_one_log_line(
        client: TestClient, caplog, what, body, job, gz, auth, status, field) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="eroica.service")
    headers = {**(AUTH if auth is None else auth), "X-Eroica-Job": job}
    if gz == "lie":
        headers["Content-Encoding"] = "gzip"
    elif gz:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    r = client.post("/v1/patterns", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["error"]
    assert client.get("/v1/jobs").json() == []                    # nothing partial stored
    assert len([m for m in caplog.messages if "eroica serve" in m]) == 1


def test_a_duplicate_rank_with_other_content_is_refused_and_the_first_kept(client: TestClient) -> None:
    first = incident_docs("INC-0017")[0]
    assert post(client, first).status_code == 201
    other = _doc(hardware__cpu_util_ratio=0.123)
    r = post(client, other)
    assert (r.status_code, r.json()["field"]) == (409, "job.rank")
    (w,) = client.get("/v1/jobs/job-1").json()["windows"]
    assert w["ranks_reported"] == 1


@pytest.mark.parametrize("path", ["/v1/jobs/..%2F..%2Fetc%2Fpasswd", "/jobs/..%2F..%2Fetc%2Fpasswd",
                                  "/v1/jobs/%2Fetc%2Fpasswd", "/windows/..%2F1/report", "/hosts/..%2F..%2Fetc%2Fpasswd",
                                  "/v1/windows/1%2F..%2F..%2Fetc/diagnosis", "/v1/findings?job=../../etc/passwd",
                                  "/../../etc/passwd"])
def test_no_route_reads_a_path_a_request_names(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (400, 404, 422), (path, r.status_code)
    assert "root:" not in r.text


def test_reads_can_require_the_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from service_support import TOKEN

    from eroica.service.app import Settings, create_app

    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}", token=TOKEN, read_token=True), start=False)
    with TestClient(app, base_url=LOCAL) as c:
        assert c.get("/v1/jobs").status_code == 401
        assert c.get("/v1/jobs", headers=AUTH).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_the_step_series_and_the_pages_render(client: TestClient) -> None:
    for i in range(5):
        r = client.post("/v1/jobs/job-1/steps", headers=AUTH, json={
            "first_step": i * 20, "last_step": i * 20 + 19, "median_seconds": 0.1 + 0.05 * (i >= 3),
            "p90_seconds": 0.12 + 0.05 * (i >= 3), "world_size": 4})
        assert r.status_code == 201, r.text
    for d in incident_docs("INC-0017"):
        post(client, d)
    j = wait_done(client, "job-1")
    assert len(j["steps"]) == 5
    fleet, job = client.get("/").text, client.get("/jobs/job-1").text
    assert "cpu_contention" in fleet and "job-1" in fleet
    assert "<svg" in job and "polyline" in job and "cpu_contention" in job and "full report" in job
    assert "cpu_contention" in client.get("/hosts/vm").text
    rep = client.get(f"/windows/{j['windows'][0]['pk']}/report")
    assert rep.status_code == 200 and "cpu_contention" in rep.text
    for page in (fleet, job):
        assert "http://" not in page and "https://" not in page and "<script" not in page


def test_an_unknown_job_or_window_is_a_404_naming_it(client: TestClient) -> None:
    r = client.get("/v1/jobs/nope")
    assert (r.status_code, r.json()["field"]) == (404, "job")
    assert client.get("/v1/windows/99").status_code == 404
    assert client.get("/v1/windows/99/diagnosis").status_code == 404


def test_the_schema_is_versioned_and_upgrades_in_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from eroica.service.db import make_engine, migrate, revision

    eng = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    assert revision(eng) is None
    migrate(eng)
    migrate(eng)                 # again: nothing to do, nothing lost
    assert revision(eng) == "0015"


def test_a_database_of_the_first_schema_upgrades_in_place_and_keeps_its_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from eroica.service.db import MIGRATIONS, make_engine, migrate, revision

    eng = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with eng.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    with eng.begin() as conn:
        conn.execute(sa.text("""INSERT INTO jobs VALUES ('old-job', 4, '["node-b", "node-a"]', 1.0, 2.0)"""))
    migrate(eng)
    assert revision(eng) == "0015"
    with eng.connect() as conn:
        assert conn.execute(sa.text("SELECT id, name FROM jobs")).one() == ("old-job", "old-job")  # 0006: its own name
        assert "window_opened_at" in [c["name"] for c in sa.inspect(conn).get_columns("windows")]
        assert "hang_snapshots" in sa.inspect(conn).get_table_names()                            # 0007
        assert conn.execute(sa.text("SELECT host FROM job_hosts ORDER BY host")).scalars().all() == [
            "node-a", "node-b"]                                                               # 0010: carried over


def test_responses_validate_against_the_published_api_schema(client: TestClient) -> None:
    import jsonschema

    from eroica.cli.schema_cmd import schema

    root = Path(__file__).parents[2]
    committed = json.loads((root / "docs" / "schema" / "eroica.api.v1.schema.json").read_text())
    assert committed == schema("api"), "regenerate: eroica schema api > docs/schema/eroica.api.v1.schema.json"
    for d in incident_docs("INC-0017"):
        post(client, d)
    j = wait_done(client, "job-1")
    defs = committed["$defs"]

    def check(doc: object, name: str) -> None:
        jsonschema.validate(doc, {"$defs": defs, "$ref": f"#/$defs/{name}"})

    check(j, "JobDetail")
    for job in client.get("/v1/jobs").json():
        check(job, "Job")
    check(client.get(f"/v1/windows/{j['windows'][0]['pk']}").json(), "WindowDetail")
    for f in client.get("/v1/findings").json():
        check(f, "Finding")
