"""The versioned HTTP API (`/v1/...`). Every id in a path is a database key (a job id checked
against its pattern, a window's number), never a file name: no request reaches the filesystem."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eroica.service import api_models as m
from eroica.service import hangs, store
from eroica.service.db import findings, issues, jobs, steps, windows
from eroica.service.fleet import drain_list, host_ranking, week_summary
from eroica.service.lifecycle import export_false_positive, state_of, transition

if TYPE_CHECKING:
    from eroica.service.app import Service


class StepSummaryIn(BaseModel):
    """One summary of the job's always-on step-time series (rank 0 sends one every N steps)."""

    model_config = ConfigDict(extra="forbid")
    first_step: int = Field(ge=0)
    last_step: int = Field(ge=0)
    median_seconds: float = Field(gt=0, lt=86400)
    p90_seconds: float = Field(gt=0, lt=86400)
    world_size: int = Field(ge=1, le=10_000_000)


WINDOW_COLUMNS = ("pk", "job_id", "window_id", "world_size", "start_step", "end_step", "trigger", "status",
                  "ranks_reported", "first_doc_at", "last_doc_at", "window_opened_at", "window_closed_at", "attempts",
                  "diagnosed_at", "error")


def window_json(w: Any) -> dict[str, Any]:
    out = {k: w[k] for k in WINDOW_COLUMNS}
    done = w["diagnosed_at"]
    out["seconds_to_diagnosis"] = round(done - w["last_doc_at"], 3) if done is not None else None
    # from the last rank's window close (its clock) to the stored diagnosis: what an SRE waits
    out["seconds_close_to_diagnosis"] = (round(done - w["window_closed_at"], 3)
                                         if done is not None and w["window_closed_at"] is not None else None)
    return out


def finding_json(f: Any) -> dict[str, Any]:
    return {k: f[k] for k in ("id", "window_pk", "job_id", "root_cause", "category", "ranks", "hosts", "function",
                              "confidence", "summary", "rule_ids", "created_at")}


def read_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """The request body, gunzipped when it says so, never more than `limit` bytes."""
    if raw and len(raw) > limit:
        raise store.IngestError(413, f"body over {limit} bytes", "body")
    if (encoding or "").lower() == "gzip":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(raw, limit + 1)
        except zlib.error as exc:
            raise store.IngestError(400, f"Content-Encoding gzip, but the body is not gzip: {exc}", "body") from exc
        if len(out) > limit:
            raise store.IngestError(413, f"body over {limit} bytes once decompressed", "body")
        return out
    return raw


def api_router(svc: Service) -> APIRouter:
    r = APIRouter(prefix="/v1")
    eng = svc.eng

    @r.post("/patterns", status_code=201, response_model=m.Accepted)
    async def post_patterns(request: Request) -> Response:
        job = store.valid_job_id(request.headers.get("x-eroica-job", ""))
        body = read_body(await request.body(), request.headers.get("content-encoding"), svc.settings.max_body_bytes)
        got = svc.accept(job, body, f"upload for job {job}", name=request.headers.get("x-eroica-job-name") or None)
        return JSONResponse({"window": got.window_pk, "created": got.created}, status_code=201 if got.created else 200)

    @r.post("/jobs/{job_id}/steps", status_code=201)
    async def post_steps(job_id: str, request: Request) -> dict[str, str]:
        store.valid_job_id(job_id)
        try:
            s = StepSummaryIn.model_validate_json(read_body(await request.body(),
                                                            request.headers.get("content-encoding"), 65536))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise store.IngestError(422, err["msg"], ".".join(str(x) for x in err["loc"])) from exc
        store.add_steps(eng, job_id, s.first_step, s.last_step, s.median_seconds, s.p90_seconds, s.world_size,
                        name=request.headers.get("x-eroica-job-name") or None)
        return {"status": "stored"}

    @r.post("/jobs/{job_id}/hang", status_code=201)
    async def post_hang(job_id: str, request: Request) -> dict[str, Any]:
        """A rank's hang snapshot (its watchdog saw no step for too long): kept, and the job's hang
        localized now, while the job still waits; a confident verdict opens or updates its issue."""
        store.valid_job_id(job_id)
        doc = hangs.parse(read_body(await request.body(), request.headers.get("content-encoding"),
                                    svc.settings.max_body_bytes))
        f = hangs.add(eng, job_id, doc, name=request.headers.get("x-eroica-job-name") or None)
        return {"status": "stored", "hang": f.model_dump(mode="json") if f is not None else None}

    @r.get("/jobs/{job_id}/hang")
    def get_hang(job_id: str) -> dict[str, Any]:
        f = hangs.current(eng, store.valid_job_id(job_id))
        if f is None:
            raise store.IngestError(404, f"no hang snapshot for job {job_id!r}", "job")
        return f.model_dump(mode="json")

    @r.post("/jobs/{job_id}/end")
    def end_job(job_id: str) -> dict[str, str]:
        """The run ended (its rank 0 closed): the alerts of its open issues resolve."""
        store.end_job(eng, store.valid_job_id(job_id), "job")
        return {"status": "ended"}

    @r.get("/jobs", response_model=list[m.Job])
    def list_jobs() -> list[dict[str, Any]]:
        with eng.connect() as c:
            rows = c.execute(sa.select(jobs).order_by(jobs.c.last_seen.desc())).mappings().all()
            counts: dict[str, int] = dict(c.execute(
                sa.select(findings.c.job_id, sa.func.count()).where(findings.c.confidence >= 0.5)
                .group_by(findings.c.job_id)).all())
        return [{**dict(j), "confident_findings": int(counts.get(j["id"], 0))} for j in rows]

    @r.get("/jobs/{job_id}", response_model=m.JobDetail)
    def get_job(job_id: str) -> dict[str, Any]:
        store.valid_job_id(job_id)
        with eng.connect() as c:
            j = c.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().first()
            if j is None:
                raise store.IngestError(404, f"no job {job_id!r}", "job")
            ws = c.execute(sa.select(windows).where(windows.c.job_id == job_id).order_by(windows.c.start_step))
            series = c.execute(sa.select(steps).where(steps.c.job_id == job_id).order_by(steps.c.first_step))
            return {**dict(j), "windows": [window_json(w) for w in ws.mappings()],
                    "steps": [dict(s) for s in series.mappings()]}

    @r.get("/windows/{pk}", response_model=m.WindowDetail)
    def get_window(pk: int) -> dict[str, Any]:
        with eng.connect() as c:
            w = c.execute(sa.select(windows).where(windows.c.pk == pk)).mappings().first()
            if w is None:
                raise store.IngestError(404, f"no window {pk}", "window")
            fs = c.execute(sa.select(findings).where(findings.c.window_pk == pk)
                           .order_by(findings.c.confidence.desc())).mappings().all()
        return {**window_json(w), "findings": [finding_json(f) for f in fs]}

    @r.get("/windows/{pk}/diagnosis")
    def get_diagnosis(pk: int) -> Response:
        body = store.diagnosis_of(eng, pk)
        if body is None:
            raise store.IngestError(404, f"window {pk} has no diagnosis (yet)", "window")
        return Response(body, media_type="application/json")

    @r.get("/findings", response_model=list[m.Finding])
    def list_findings(job: str | None = None, root_cause: str | None = None, host: str | None = None,
                      min_confidence: float = 0.0, limit: int = 200) -> list[dict[str, Any]]:
        q = sa.select(findings).where(findings.c.confidence >= min_confidence)
        if job is not None:
            q = q.where(findings.c.job_id == store.valid_job_id(job))
        if root_cause is not None:
            q = q.where(findings.c.root_cause == root_cause)
        with eng.connect() as c:
            rows = c.execute(q.order_by(findings.c.created_at.desc()).limit(max(1, min(limit, 5000)))).mappings().all()
        out = [finding_json(f) for f in rows]
        return [f for f in out if host is None or host in f["hosts"]]

    return r



class TransitionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    who: str
    why: str | None = None
    url: str | None = None
    kind: str | None = None


def issue_router(svc: Service) -> APIRouter:

    r = APIRouter(prefix="/v1")
    eng = svc.eng

    @r.get("/issues", response_model=list[m.Issue])
    def list_issues(state: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        q = sa.select(issues)
        if state is not None:
            q = q.where(issues.c.state == state)
        if job is not None:
            q = q.where(issues.c.job_id == store.valid_job_id(job))
        with eng.connect() as c:
            return [dict(x) for x in c.execute(q.order_by(issues.c.last_seen.desc()).limit(1000)).mappings()]

    @r.post("/issues/{iid}/{action}", response_model=m.Issue)
    async def act(iid: int, action: str, request: Request) -> dict[str, Any]:
        state = state_of(action)
        try:
            body = TransitionIn.model_validate_json(await request.body())
        except ValidationError as exc:
            err = exc.errors()[0]
            raise store.IngestError(422, err["msg"], ".".join(str(x) for x in err["loc"])) from exc
        return transition(eng, iid, state, body.who, body.why, body.url, body.kind)

    @r.get("/hosts")
    def hosts() -> list[dict[str, Any]]:
        return host_ranking(eng, svc.settings.drain_min_confidence)

    @r.get("/summary")
    def summary(days: float = 7.0) -> dict[str, Any]:
        now = time.time()
        return week_summary(eng, now - max(0.0, min(days, 3660.0)) * 86400, now + 1)

    @r.get("/drain")
    def drain(format: str = "json") -> Response:
        s = svc.settings
        hosts = drain_list(eng, s.drain_min_jobs, s.drain_min_confidence)
        if format == "text":
            return Response("".join(h["host"] + "\n" for h in hosts), media_type="text/plain")
        return JSONResponse({"min_jobs": s.drain_min_jobs, "min_confidence": s.drain_min_confidence, "hosts": hosts})

    @r.get("/issues/{iid}/incident")
    def export(iid: int) -> dict[str, Any]:
        return export_false_positive(eng, iid)

    return r
