"""Raw traces in the service: a rank whose window's raw trace was kept (eroica.collector.raw_keep)
sends it (`POST /v1/jobs/{id}/traces`); the service keeps each job's newest MAX_PER_JOB and links
them from the job's page and its JSON, to download and open in Perfetto (ui.perfetto.dev) or
chrome://tracing. What the collector never keeps (privacy levels that drop names) never arrives."""

from __future__ import annotations

import gzip
import json
import time
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from eroica.schema.patterns import WINDOW_ID_PATTERN
from eroica.schema.raw_trace import RawTraceHeader, unpack
from eroica.service.db import raw_traces, reading, traces_of, writing
from eroica.service.errors import Invalid, Malformed, NotFound
from eroica.service.guard import principal_of
from eroica.service.inputs import MAX_INT, refusal
from eroica.service.routes import JobId, job_body, job_name, may_write
from eroica.service.runs import touch_run, upsert

MAX_PER_JOB = 60          # a job's newest kept traces (3 ranks a window: its last 20 windows)
WindowId = Annotated[str, Path(pattern=WINDOW_ID_PATTERN, max_length=64)]
Rank = Annotated[int, Path(ge=0, le=MAX_INT)]


def parse(body: bytes) -> tuple[RawTraceHeader, bytes]:
    """The upload's header and its trace, gzip'd for keeping; a 400/422 naming the field otherwise."""
    try:
        head, trace = unpack(body)
    except ValidationError as exc:
        raise refusal(exc) from exc
    except ValueError as exc:      # not JSON, or no Chrome trace
        kind = Malformed if isinstance(exc, json.JSONDecodeError) or "nested too deep" in str(exc) else Invalid
        raise kind(str(exc)[:300], "trace") from exc
    return head, gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), 6)


def add(eng: sa.Engine, job_id: str, head: RawTraceHeader, packed: bytes, size: int, name: str | None = None,
        now: float | None = None) -> int:
    """Keep one rank's trace of a window (a resend replaces it); the job's oldest beyond MAX_PER_JOB
    go. Returns how many the job keeps."""
    now = time.time() if now is None else now
    if head.rank >= head.world_size:
        raise Invalid(f"rank {head.rank} is not below world_size {head.world_size}", "rank")
    with writing(eng) as c:
        touch_run(c, job_id, name, head.world_size, head.host, now, "world_size")
        upsert(c, raw_traces, {"job_id": job_id, "window_id": head.window_id, "rank": head.rank, "body": packed,
                               "trace_bytes": size, "host": head.host, "at": now}, ["job_id", "window_id", "rank"])
        kept = c.execute(sa.select(raw_traces.c.window_id, raw_traces.c.rank).where(raw_traces.c.job_id == job_id)
                         .order_by(raw_traces.c.at.desc(), raw_traces.c.window_id.desc())).all()
        for w, r in kept[MAX_PER_JOB:]:
            c.execute(raw_traces.delete().where(raw_traces.c.job_id == job_id, raw_traces.c.window_id == w,
                                                raw_traces.c.rank == r))
    return min(len(kept), MAX_PER_JOB)


def router(svc: Any) -> APIRouter:
    r = APIRouter(prefix="/v1")
    eng = svc.eng

    @r.post("/jobs/{job_id}/traces", status_code=201)
    async def post_trace(job_id: JobId, request: Request) -> dict[str, Any]:
        """A rank's kept raw trace of a window (`eroica.schema.raw_trace`): kept, linked from the job."""
        name = job_name(request)
        raw = await job_body(request, svc.settings.max_body_bytes)

        def work() -> dict[str, Any]:
            head, packed = parse(raw)
            may_write(eng, principal_of(request), job_id, name)
            kept = add(eng, job_id, head, packed, len(raw), name=name)
            return {"status": "stored", "window_id": head.window_id, "rank": head.rank, "kept_for_job": kept}
        return await run_in_threadpool(work)

    @r.get("/jobs/{job_id}/traces")
    def list_traces(job_id: JobId) -> dict[str, list[dict[str, Any]]]:
        with reading(eng) as c:
            return traces_of(c, job_id)

    @r.get("/jobs/{job_id}/traces/{window_id}/{rank}")
    def get_trace(job_id: JobId, window_id: WindowId, rank: Rank) -> Response:
        """The trace as the rank kept it (Chrome trace JSON): a download, to open in Perfetto."""
        with reading(eng) as c:
            body = c.execute(sa.select(raw_traces.c.body).where(
                raw_traces.c.job_id == job_id, raw_traces.c.window_id == window_id,
                raw_traces.c.rank == rank)).scalar()
        if body is None:
            raise NotFound(f"no raw trace of rank {rank} in window {window_id} of job {job_id!r} "
                                   f"(a job keeps its newest {MAX_PER_JOB})", "trace")
        return Response(gzip.decompress(body), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="{job_id}-{window_id}-rank-{rank}.trace.json"'})

    return r
