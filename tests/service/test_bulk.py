"""Batched ingestion: a host's ranks in one upload (application/x-ndjson, one document per line),
stored in one transaction or not at all, on SQLite and PostgreSQL; the same answer as one document
per request."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from polling import until
from service_support import AUTH, LOCAL, PG, PG_WHY, TOKEN, database, incident_docs

from eroica.service import bulk
from eroica.service.app import Service, Settings, create_app
from eroica.service.db import documents, job_hosts, windows

WITH_PG = pytest.param("postgresql", marks=pytest.mark.skipif(not PG, reason=PG_WHY))


def post_batch(c: TestClient, lines: list[bytes], job: str = "bulk-1", gz: bool = True):  # type: ignore[no-untyped-def]
    body = b"".join(ln.rstrip(b"\n") + b"\n" for ln in lines)
    headers = {**AUTH, "X-Eroica-Job": job, "Content-Type": "application/x-ndjson"}
    if gz:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    return c.post("/v1/patterns", content=body, headers=headers)


def wait_done(c: TestClient, job: str) -> dict:  # type: ignore[type-arg]
    def diagnosed() -> dict | None:  # type: ignore[type-arg]
        j = c.get(f"/v1/jobs/{job}").json()
        return j if j.get("windows") and all(w["status"] == "done" for w in j["windows"]) else None
    return until(diagnosed, 60, f"every window of {job} diagnosed")


def host_doc(d: bytes, host: str) -> bytes:
    o = json.loads(d)
    o["job"]["hostname"] = host
    return json.dumps(o).encode()


def test_two_hosts_batches_make_the_window_and_it_is_diagnosed_as_single_uploads_are(client: TestClient) -> None:
    docs = [host_doc(d, "node-a" if i < 2 else "node-b") for i, d in enumerate(incident_docs("INC-0017"))]
    r = post_batch(client, docs[:2])
    assert (r.status_code, r.json()["created"], r.json()["existing"]) == (201, 2, 0)
    r = post_batch(client, docs[2:], gz=False)
    assert (r.status_code, r.json()["created"]) == (201, 2)
    j = wait_done(client, "bulk-1")
    (w,) = j["windows"]
    assert (w["ranks_reported"], w["attempts"]) == (4, 1)
    assert j["hosts"] == ["node-a", "node-b"]
    fs = client.get("/v1/findings", params={"job": "bulk-1", "min_confidence": 0.5}).json()
    assert [(f["root_cause"], f["ranks"]) for f in fs][:1] == [("cpu_contention", [2])]
    # the same batch again: nothing new, nothing diagnosed again
    r = post_batch(client, docs[:2])
    assert (r.status_code, r.json()["created"], r.json()["existing"]) == (200, 0, 2)
    assert "eroica_documents_ingested_total 4.0" in client.get("/metrics").text


@pytest.mark.parametrize("bad, status, field", [
    (b"{not json", 400, "body"),
    (None, 422, "job.rank"),                  # rank 9 of a world of 4
    (b'{"schema": "eroica.patterns/v0"}', 422, "schema"),
])
def test_a_bad_line_refuses_the_whole_batch_naming_the_line(client: TestClient, bad: bytes | None, status: int,
                                                            field: str) -> None:
    docs = incident_docs("INC-0017")
    if bad is None:
        o = json.loads(docs[0])
        o["job"]["rank"] = 9
        bad = json.dumps(o).encode()
    r = post_batch(client, [docs[0], docs[1], bad, docs[3]], job="bad-batch")
    assert (r.status_code, r.json()["field"]) == (status, field), r.text
    assert "line 3" in r.json()["error"]
    assert client.get("/v1/jobs/bad-batch").status_code == 404           # nothing of it stored


def test_a_batch_that_contradicts_a_stored_document_stores_nothing(client: TestClient) -> None:
    docs = incident_docs("INC-0017")
    assert post_batch(client, docs[:1], job="clash").status_code == 201
    other = json.loads(docs[0])
    other["window"]["trigger"] = "requested" if other["window"]["trigger"] != "requested" else "forced"
    r = post_batch(client, [docs[1], json.dumps(other).encode(), docs[2]], job="clash")
    assert (r.status_code, r.json()["field"]) == (409, "job.rank") and "line 2" in r.json()["error"]
    (w,) = client.get("/v1/jobs/clash").json()["windows"]
    assert w["ranks_reported"] == 1                                       # ranks 1 and 2 were not kept either


def test_a_batch_over_the_line_limit_is_413(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "MAX_LINES", 3)
    r = post_batch(client, incident_docs("INC-0017"), job="big")
    assert (r.status_code, r.json()["field"]) == (413, "body")


@pytest.mark.parametrize("kind", ["sqlite", WITH_PG])
def test_batches_store_every_rank_once_in_one_transaction_each(tmp_path: Path, kind: str) -> None:
    """A 64-rank window as 8 host batches of 8 (the documents re-ranked from one incident's), with
    every batch sent twice: 64 documents stored once, the window complete."""
    base = json.loads(incident_docs("INC-0017")[0])
    lines = []
    for r in range(64):
        o = json.loads(json.dumps(base))
        o["job"].update(rank=r, world_size=64, local_rank=r % 8, hostname=f"node-{r // 8}")
        lines.append(json.dumps(o).encode())
    with database(kind, tmp_path) as url:
        svc = Service(Settings(db_url=url, poll_seconds=0.05))
        for _ in range(2):
            for h in range(8):
                svc.accept_many("wide", b"\n".join(lines[h * 8:(h + 1) * 8]), "test")
        with svc.eng.connect() as c:
            assert c.execute(sa.select(sa.func.count()).select_from(documents)).scalar() == 64
            assert c.execute(sa.select(windows.c.ranks_reported)).scalar() == 64
            assert c.execute(sa.select(sa.func.count()).select_from(job_hosts)).scalar() == 8
        svc.eng.dispose()


def test_a_batch_needs_the_token_like_any_write(tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'a.db'}", token=TOKEN), start=False)
    with TestClient(app, base_url=LOCAL) as c:
        r = c.post("/v1/patterns", content=b"\n".join(incident_docs("INC-0017")),
                   headers={"X-Eroica-Job": "x", "Content-Type": "application/x-ndjson"})
        assert r.status_code == 401


def test_a_second_gzip_member_is_never_stored_unvalidated(client: TestClient) -> None:
    """The body's gzip is kept as it came only when it is exactly what was validated: a second gzip
    member (which the service does not read) must not smuggle documents into the stored batch."""
    import sqlalchemy as sa

    from eroica.service.docs import doc_texts

    docs = incident_docs("INC-0017")
    body = gzip.compress(docs[0] + b"\n" + docs[1] + b"\n") + gzip.compress(docs[2] + b"\n")
    r = client.post("/v1/patterns", content=body, headers={**AUTH, "X-Eroica-Job": "smuggle",
                                                          "Content-Type": "application/x-ndjson",
                                                          "Content-Encoding": "gzip"})
    assert (r.status_code, r.json()["created"]) == (201, 2)
    svc_eng = client.app.state.svc.eng  # type: ignore[attr-defined]
    with svc_eng.connect() as c:
        (pk,) = c.execute(sa.select(windows.c.pk)).scalars().all()
        assert sorted(doc_texts(c, pk)) == [0, 1]
        (stored,) = c.execute(sa.select(bulk.batches.c.body)).scalars().all()
    assert gzip.decompress(stored).count(b"\n") == 2


@pytest.mark.parametrize("kind", ["sqlite", WITH_PG])
def test_a_batchs_documents_are_parsed_once_and_the_worker_reads_few_of_them_again(tmp_path: Path,
                                                                                    kind: str) -> None:
    """A wide window uploaded as host batches: each batch's documents are kept as columns when they
    are validated; the diagnosis worker merges those (reading a batch's text only for the few
    documents the engine wants in full) and concludes what it concludes from the documents
    themselves; once the diagnosis is stored, the columns are gone."""
    from eroica.engine.load import window_of_packs
    from eroica.engine.pipeline import DiagnoseOptions, diagnose_documents
    from eroica.lab.simulate import simulate
    from eroica.schema.diagnosis import Diagnosis
    from eroica.service import worker
    from eroica.service.db import batch_columns

    simulate(tmp_path / "sim", 160, "gpu_throttled", seed=5, tp=8, pp=5, packed=True)
    hosts = [f.read_bytes() for f in sorted((tmp_path / "sim").rglob("host-*.jsonl"))]
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *rest: object) -> None:
        statements.append(statement)

    with database(kind, tmp_path) as url:
        svc = Service(Settings(db_url=url, poll_seconds=0.05, grace_seconds=600))
        for h in hosts:
            svc.accept_many("sim", h, "a host's batch")
        columns = sa.select(sa.func.count()).select_from(batch_columns)
        with svc.eng.connect() as c:
            (pk,) = c.execute(sa.select(windows.c.pk)).scalars()
            assert c.execute(columns).scalar() == len(hosts) == 20
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
        try:
            served = Diagnosis.model_validate_json(worker.diagnose_stored(url, pk, "w000-s200", [], [], 1))
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
        offline = diagnose_documents([window_of_packs("w000-s200", [gzip.compress(h) for h in hosts])],
                                     opts=DiagnoseOptions(in_process=True), run="w000-s200")
        assert served.windows[0].findings and [
            (f.root_cause, f.ranks, f.confidence) for f in served.windows[0].findings] == [
            (f.root_cause, f.ranks, f.confidence) for f in offline.windows[0].findings]
        bodies = [s for s in statements if "batches.body" in s]     # one batch's text each
        assert 0 < len(bodies) <= 8, bodies
        svc.start()                     # the service's own dispatch: diagnosed, stored, the columns dropped
        try:
            t0 = time.time()
            while time.time() - t0 < 60:
                with svc.eng.connect() as c:
                    if c.execute(sa.select(windows.c.status)).scalar() == "done":
                        break
                time.sleep(0.1)
            with svc.eng.connect() as c:
                assert c.execute(sa.select(windows.c.status)).scalar() == "done"
                assert c.execute(columns).scalar() == 0
        finally:
            svc.stop()
            svc.eng.dispose()
