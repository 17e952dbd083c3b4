"""The versioned HTTP API (`/v1/...`). Every id in a path is a database key (a job id checked
against its pattern, a window's number), never a file name: no request reaches the filesystem."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from eroica.schema.steps import StepSeriesSummary
from eroica.service import api_models as m
from eroica.service import hangs, store
from eroica.service.bulk import BulkIngested
from eroica.service.db import confident_counts, findings, hosts_of, issues, jobs, reading, steps, traces_of, windows
from eroica.service.errors import Forbidden, NotFound
from eroica.service.fleet import drain_list, host_ranking, week_summary
from eroica.service.guard import NDJSON, Principal, decode_body, principal_of, read_limited, unpack_body
from eroica.service.inputs import MAX_INT, TransitionIn, refusal
from eroica.service.lifecycle import NEXT, export_false_positive, state_of, transition
from eroica.service.runs import JOB_ID, NAME_HEADER, claim_writer, name_of, valid_job_id

if TYPE_CHECKING:
    from eroica.service.app import Service


Key = Annotated[int, Path(ge=1, le=MAX_INT)]            # a database key in a path: fits its column
JobId = Annotated[str, Path(pattern=JOB_ID.pattern, max_length=128)]    # a run's id: never a file name
ACTIONS = ("ack", "link", *NEXT)                          # an issue's actions (lifecycle.state_of): the API's path
JOB_WRITE_BODY = 65536                                    # a step summary or a job's end
BODY = {"application/json": {"schema": {"type": "object"}}}


def _header(name: str, required: bool, what: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": required, "description": what,
            "schema": {"type": "string", "pattern": JOB_ID.pattern, "maxLength": 128}}


#: the headers a job's writes read themselves (runs.valid_job_id checks them): its id, and the job's name
JOB_HEADER = _header("X-Eroica-Job", True, "the run's id (the sink's `<name>.<run>`)")
NAME = _header("X-Eroica-Job-Name", False, "the job's name, the same across its restarts")


def _body(ref: str | None = None, headers: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """An OpenAPI request body (and the headers) of a route that reads them itself (streamed, size-checked)."""
    schema = {"$ref": f"#/components/schemas/{ref}"} if ref else {"type": "object"}
    out: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
    return {**out, "parameters": list(headers)} if headers else out


async def job_body(request: Request, limit: int) -> bytes:
    """A job document's body: read while counting (413 past `limit`), then gunzipped off the event loop."""
    raw = await read_limited(request, limit)
    return await run_in_threadpool(decode_body, raw, request.headers.get("content-encoding"), limit)


def job_name(request: Request) -> str | None:
    name = request.headers.get(NAME_HEADER) or None
    return valid_job_id(name, NAME_HEADER) if name is not None else None


def may_write(eng: sa.Engine, who: Principal, job_id: str, name: str | None) -> None:
    """A job's own token may write only jobs whose id and name match its glob (the run's stored name when the
    request names none; the sink's id is `<name>.<run>`), and only a job it created (or nobody did)."""
    if who.kind != "job":
        return
    with reading(eng) as c:
        stored = name_of(c, job_id)
    for what, value in (("id", job_id), ("name", name), ("stored name", stored)):
        if value is not None and not who.may_write_job(value):
            raise Forbidden(f"this job token may not write job {job_id!r}: its {what} {value!r} does not match the "
                            f"token's scope {who.jobs!r}", "authorization")
    why = claim_writer(eng, job_id, who.writer)
    if why is not None:
        raise Forbidden(why, "authorization")


WINDOW_COLUMNS = ("pk", "job_id", "window_id", "world_size", "start_step", "end_step", "trigger", "status",
                  "ranks_reported", "first_doc_at", "last_doc_at", "window_opened_at", "window_closed_at", "attempts",
                  "diagnoses_stored", "diagnosed_at", "error")


def window_json(w: Any) -> dict[str, Any]:
    out = {k: w[k] for k in WINDOW_COLUMNS}
    done = w["diagnosed_at"]
    out["seconds_to_diagnosis"] = round(done - w["last_doc_at"], 3) if done is not None else None
    # from the last rank's window close (its clock) to the stored diagnosis: what an SRE waits
    out["seconds_close_to_diagnosis"] = (round(done - w["window_closed_at"], 3)
                                         if done is not None and w["window_closed_at"] is not None else None)
    return out


def finding_json(f: Any) -> dict[str, Any]:
    return {**{k: f[k] for k in ("id", "window_pk", "job_id", "root_cause", "category", "ranks", "hosts", "function",
                                 "confidence", "summary", "rule_ids", "created_at")},
            "devices": f["devices"] or [], "scope": f["scope"] or "rank"}


def api_router(svc: Service) -> APIRouter:
    r = APIRouter(prefix="/v1")
    eng = svc.eng

    @r.post("/patterns", status_code=201, response_model=m.Accepted,
            openapi_extra=_body("PatternsDoc", (JOB_HEADER, NAME)))
    async def post_patterns(request: Request) -> Response:
        job = valid_job_id(request.headers.get("x-eroica-job", ""), "x-eroica-job")
        name = job_name(request)
        raw = await read_limited(request, svc.settings.max_body_bytes)
        encoding = request.headers.get("content-encoding")
        limit = svc.settings.max_body_bytes

        # one hop to a worker thread for all of it: decompressing, parsing, the transaction
        if request.headers.get("content-type", "").split(";")[0].strip().lower() == NDJSON:
            def many() -> BulkIngested:
                body, packed = unpack_body(raw, encoding, limit)
                may_write(eng, principal_of(request), job, name)
                return svc.accept_many(job, body, f"batch for job {job}", name=name, packed=packed)
            b = await run_in_threadpool(many)
            return JSONResponse({"windows": b.windows, "created": b.created, "existing": b.existing},
                                status_code=201 if b.created else 200)

        def work() -> store.Ingested:
            body = decode_body(raw, encoding, limit)
            may_write(eng, principal_of(request), job, name)
            return svc.accept(job, body, f"upload for job {job}", name=name)
        got = await run_in_threadpool(work)
        return JSONResponse({"window": got.window_pk, "created": got.created}, status_code=201 if got.created else 200)

    @r.post("/jobs/{job_id}/steps", status_code=201, openapi_extra=_body("StepSeriesSummary", (NAME,)))
    async def post_steps(job_id: JobId, request: Request) -> dict[str, str]:
        valid_job_id(job_id)
        name = job_name(request)
        raw = await job_body(request, JOB_WRITE_BODY)
        try:
            s = StepSeriesSummary.model_validate_json(raw)
        except ValidationError as exc:
            raise refusal(exc) from exc

        def work() -> None:
            may_write(eng, principal_of(request), job_id, name)
            store.add_steps(eng, job_id, s.first_step, s.last_step, s.median_seconds, s.p90_seconds, s.world_size,
                            name=name)
        await run_in_threadpool(work)
        return {"status": "stored"}

    @r.post("/jobs/{job_id}/hang", status_code=201, openapi_extra=_body("HangSnapshot", (NAME,)))
    async def post_hang(job_id: JobId, request: Request) -> dict[str, Any]:
        """A rank's hang snapshot (its watchdog suspected or confirmed a hang, or saw it resolve): kept;
        the diagnosis worker localizes the job's hang next, before any window, and the verdict is
        served by `GET /v1/jobs/{id}/hang` (a confident confirmed one opens or updates its issue)."""
        valid_job_id(job_id)
        name = job_name(request)
        raw = await job_body(request, svc.settings.max_body_bytes)

        def work() -> dict[str, Any]:
            doc = hangs.parse(raw)
            may_write(eng, principal_of(request), job_id, name)
            hangs.add(eng, job_id, doc, name=name)
            return {"status": "stored", "verdict": f"/v1/jobs/{job_id}/hang"}
        return await run_in_threadpool(work)

    @r.get("/jobs/{job_id}/hang")
    def get_hang(job_id: JobId) -> dict[str, Any]:
        """The job's stored hang verdict; `pending`: snapshots came after it and a newer one is being made."""
        f, pending = hangs.current(eng, store.valid_job_id(job_id))
        if f is None:
            raise NotFound(f"no hang verdict for job {job_id!r}" + (" yet: its snapshots are being localized"
                                                                     if pending else ""), "job")
        return {**f.model_dump(mode="json"), "pending": pending}

    @r.post("/jobs/{job_id}/end", openapi_extra=_body())
    async def end_job(job_id: JobId, request: Request) -> dict[str, str]:
        """The run ended (its rank 0 closed): the alerts of its open issues resolve."""
        valid_job_id(job_id)
        await job_body(request, JOB_WRITE_BODY)       # its body says nothing; still bounded

        def work() -> None:
            may_write(eng, principal_of(request), job_id, None)
            store.end_job(eng, job_id, "job")
        await run_in_threadpool(work)
        return {"status": "ended"}

    @r.get("/jobs", response_model=list[m.Job])
    def list_jobs() -> list[dict[str, Any]]:
        with reading(eng) as c:
            rows = c.execute(sa.select(jobs).order_by(jobs.c.last_seen.desc())).mappings().all()
            counts = confident_counts(c)
            hosts = hosts_of(c, [j["id"] for j in rows])
        return [{**dict(j), "hosts": hosts[j["id"]], "confident_findings": int(counts.get(j["id"], 0))}
                for j in rows]

    @r.get("/jobs/{job_id}", response_model=m.JobDetail)
    def get_job(job_id: JobId) -> dict[str, Any]:
        store.valid_job_id(job_id)
        with reading(eng) as c:
            j = c.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().first()
            if j is None:
                raise NotFound(f"no job {job_id!r}", "job")
            ws = c.execute(sa.select(windows).where(windows.c.job_id == job_id).order_by(windows.c.start_step))
            series = c.execute(sa.select(steps).where(steps.c.job_id == job_id).order_by(steps.c.first_step))
            hosts = hosts_of(c, [job_id])[job_id]
            kept = traces_of(c, job_id)
            return {**dict(j), "hosts": hosts, "confident_findings": confident_counts(c, [job_id]).get(job_id, 0),
                    "windows": [{**window_json(w), "raw_traces": kept.get(w["window_id"], [])} for w in ws.mappings()],
                    "steps": [dict(s) for s in series.mappings()], "story": store.story_of(c, job_id)}

    @r.get("/windows/{pk}", response_model=m.WindowDetail)
    def get_window(pk: Key) -> dict[str, Any]:
        with reading(eng) as c:
            w = c.execute(sa.select(windows).where(windows.c.pk == pk)).mappings().first()
            if w is None:
                raise NotFound(f"no window {pk}", "window")
            fs = c.execute(sa.select(findings).where(findings.c.window_pk == pk)
                           .order_by(findings.c.confidence.desc())).mappings().all()
        return {**window_json(w), "findings": [finding_json(f) for f in fs]}

    @r.get("/windows/{pk}/diagnosis")
    def get_diagnosis(pk: Key) -> Response:
        body = store.diagnosis_of(eng, pk)
        if body is None:
            raise NotFound(f"window {pk} has no diagnosis (yet)", "window")
        return Response(body, media_type="application/json")

    @r.get("/findings", response_model=list[m.Finding])
    def list_findings(job: str | None = None, root_cause: Annotated[str | None, Query(max_length=64)] = None,
                      host: Annotated[str | None, Query(max_length=255)] = None,
                      min_confidence: Annotated[float, Query(ge=0, le=1)] = 0.0,
                      limit: Annotated[int, Query(ge=1, le=5000)] = 200) -> list[dict[str, Any]]:
        q = sa.select(findings).where(findings.c.confidence >= min_confidence)
        if job is not None:
            q = q.where(findings.c.job_id == store.valid_job_id(job))
        if root_cause is not None:
            q = q.where(findings.c.root_cause == root_cause)
        with reading(eng) as c:
            return [finding_json(f) for f in store.findings_where(c, q, limit, host)]

    return r



def issue_router(svc: Service) -> APIRouter:

    r = APIRouter(prefix="/v1")
    eng = svc.eng

    @r.get("/issues", response_model=list[m.Issue])
    def list_issues(state: Annotated[str | None, Query(max_length=32)] = None,
                    job: str | None = None) -> list[dict[str, Any]]:
        q = sa.select(issues)
        if state is not None:
            q = q.where(issues.c.state == state)
        if job is not None:
            q = q.where(issues.c.job_id == store.valid_job_id(job))
        with reading(eng) as c:
            return [dict(x) for x in c.execute(q.order_by(issues.c.last_seen.desc()).limit(1000)).mappings()]

    @r.post("/issues/{iid}/{action}", response_model=m.Issue, openapi_extra=_body("TransitionIn"))
    async def act(iid: Key, action: Annotated[str, Path(max_length=32, json_schema_extra={"enum": list(ACTIONS)})],
                  request: Request) -> dict[str, Any]:
        state = state_of(action)
        raw = await read_limited(request, JOB_WRITE_BODY)
        try:
            body = TransitionIn.model_validate_json(raw)
        except ValidationError as exc:
            raise refusal(exc) from exc
        return await run_in_threadpool(transition, eng, iid, state, body.who, body.why, body.url, body.kind)

    @r.get("/hosts")
    def hosts() -> list[dict[str, Any]]:
        return host_ranking(eng, svc.settings.drain_min_confidence)

    @r.get("/summary")
    def summary(days: Annotated[float, Query(ge=0, le=3660)] = 7.0) -> dict[str, Any]:
        now = time.time()
        return week_summary(eng, now - days * 86400, now + 1)

    @r.get("/drain")
    def drain(format: Annotated[str, Query(pattern="^(json|text)$")] = "json") -> Response:
        s = svc.settings
        hosts = drain_list(eng, s.drain_min_jobs, s.drain_min_confidence)
        if format == "text":
            return Response("".join(h["host"] + "\n" for h in hosts), media_type="text/plain")
        return JSONResponse({"min_jobs": s.drain_min_jobs, "min_confidence": s.drain_min_confidence, "hosts": hosts})

    @r.get("/issues/{iid}/incident")
    def export(iid: Key) -> dict[str, Any]:
        return export_false_positive(eng, iid)

    return r
