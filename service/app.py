"""The ASGI app of `eroica serve`: the versioned API (`/v1/...`), the pages, `/metrics`, and the
background loops (dispatcher: ready windows -> worker process -> stored diagnosis; watcher)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from eroica.engine import RunDirError, parse_doc
from eroica.schema.diagnosis import Diagnosis
from eroica.schema.patterns import PatternsDoc
from eroica.service import hangs, pages, store, traces
from eroica.service.bulk import BulkIngested, prepare, split_lines, write
from eroica.service.db import make_engine, migrate
from eroica.service.errors import Invalid, ServiceError
from eroica.service.group_commit import GroupCommit
from eroica.service.guard import Access, Guard
from eroica.service.inputs import document_refusal, first_problem
from eroica.service.metrics import ServiceMetrics
from eroica.service.recovery import assess
from eroica.service.routes import api_router, issue_router
from eroica.service.runs import retried
from eroica.service.worker import Diagnoser

log = logging.getLogger("eroica.service")


@dataclass
class Settings:
    db_url: str
    token: str | None = None                 # writes need it; reads too when read_token is set
    read_token: bool = False
    max_body_bytes: int = 8 * 1024 * 1024    # after decompression
    grace_seconds: float = 30.0              # a window with missing ranks is diagnosed this long after its last one
    watch: list[Path | str] = field(default_factory=list)     # ROOT or "ROOT=GLOB" (service/watch.py)
    watch_reconcile_seconds: float = 300.0   # inotify tells at once; a full scan of the roots this often
    knowledge_dirs: list[str] = field(default_factory=list)
    hang_alert_on: str = "confirmed"         # a hang's issue (and alert) opens when it is confirmed, or suspected
    workers: int = 1
    poll_seconds: float = 0.5
    job_silent_seconds: float = 900.0        # a run that sent nothing this long ended (killed without closing)
    alerts: Any = None                       # an AlertConfig (eroica.service.alerts), or no alerting
    drain_min_jobs: int = 3                  # a host drains when confident hardware findings name it in this many jobs
    drain_min_confidence: float = 0.5
    job_tokens: dict[str, str] = field(default_factory=dict)   # token -> the job names (a glob) it may write
    allowed_hosts: list[str] = field(default_factory=list)     # Host names beyond this machine's own ("*": any)
    # the reverse proxies whose X-Forwarded-Proto and X-Forwarded-For are believed (addresses or networks): behind
    # one that terminates TLS, the session cookie is Secure; anyone else's forwarded headers are ignored
    trusted_proxies: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])
    diagnosis_timeout_seconds: float = 300.0  # a diagnosis running longer is ended (its worker too) and retried
    max_attempts: int = 3                    # a window whose diagnosis failed this often fails for good
    parse_processes: int = 0                 # processes parsing a wide window's documents (0: the cores, up to 8)
    background: bool = True                  # runs the dispatch, watcher and alerts (False: an extra HTTP process)

    def __post_init__(self) -> None:
        if self.job_silent_seconds <= 0:
            raise ValueError(f"job_silent_seconds must be positive, got {self.job_silent_seconds}")
        if self.drain_min_jobs < 1:
            raise ValueError(f"drain_min_jobs must be at least 1, got {self.drain_min_jobs}")
        if self.diagnosis_timeout_seconds <= 0 or self.max_attempts < 1:
            raise ValueError("diagnosis_timeout_seconds must be positive and max_attempts at least 1")
        if self.hang_alert_on not in hangs.ALERT_ON:
            raise ValueError(f"hang_alert_on must be one of {', '.join(hangs.ALERT_ON)}, got {self.hang_alert_on!r}")
        if self.read_token and self.token is None:
            raise ValueError("read_token needs a token: without one, reads would be silently open")
        if not 0.5 <= self.drain_min_confidence <= 1:
            raise ValueError(f"drain_min_confidence must be in [0.5, 1] (a lead is never a drain), got "
                             f"{self.drain_min_confidence}")
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")


class Service:
    """The database, the metrics, the worker pool and the loops of one replica."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.eng: sa.Engine = make_engine(settings.db_url)
        migrate(self.eng)
        self.metrics = ServiceMetrics(self.eng)
        # uploads arriving together are stored in one transaction (each still answered after its commit)
        self.uploads = GroupCommit(lambda group: retried(lambda: write(self.eng, group)))
        self.diagnoser: Diagnoser | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if not self.settings.background:       # an extra HTTP process of the replica: requests only
            return
        self.diagnoser = Diagnoser(self.settings.workers,
                                   self.settings.parse_processes or min(8, os.cpu_count() or 1),
                                   self.settings.knowledge_dirs)
        self._threads = [threading.Thread(target=self._dispatch, name="eroica-dispatch", daemon=True)]
        if self.settings.watch:
            from eroica.service.watch import Watcher

            watcher = Watcher(self, self.settings.watch, self.settings.watch_reconcile_seconds)
            self._threads.append(threading.Thread(target=watcher.run, args=(self._stop,), name="eroica-watch",
                                                  daemon=True))
        if self.settings.alerts is not None:
            from eroica.service.alerts import Deliverer

            deliverer = Deliverer(self.eng, self.settings.alerts, self.settings.name)
            self._threads.append(threading.Thread(target=deliverer.run, args=(self._stop,), name="eroica-alerts",
                                                  daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        if self.diagnoser is not None:
            self.diagnoser.close()
        self.eng.dispose()

    def writer_refusal(self, job_id: str, writer: str) -> str | None:
        """Why `writer` (a watched root) may not write `job_id`: a writer of another scope created it (None: it may)."""
        from eroica.service.runs import claim_writer

        return claim_writer(self.eng, job_id, writer)

    def accept(self, job_id: str, body: bytes, where: str, name: str | None = None) -> store.Ingested:
        """Validate and store one document (the API and the watcher both come here). Blocking: the
        API calls it on a worker thread."""
        try:
            doc = parse_doc(body, where)
        except (RunDirError, ValidationError) as exc:
            self.metrics.ingest_error("invalid")
            raise document_refusal(exc) from exc
        got = self._store(job_id, [(1, doc, body)], name=name, alone=True)
        return store.Ingested(got.windows[0], bool(got.created))

    def accept_many(self, job_id: str, body: bytes, where: str, name: str | None = None,
                    packed: bytes | None = None) -> BulkIngested:
        """Validate every line of a batch (one document per line), then store them all in one
        transaction, or none: a refusal names the line. `packed`: the body as it came, exactly one
        gzip member of `body` (`guard.unpack_body` says when), kept as it is, not compressed again."""
        docs = []
        for n, line in split_lines(body):
            try:
                docs.append((n, parse_doc(line, f"{where}, line {n}", one_line=True), line))
            except (RunDirError, ValidationError) as exc:
                self.metrics.ingest_error("invalid")
                raise document_refusal(exc, f"line {n}: ") from exc
        return self._store(job_id, docs, name=name, packed=packed)

    def _store(self, job_id: str, docs: list[tuple[int, PatternsDoc, bytes]], name: str | None,
               packed: bytes | None = None, alone: bool = False) -> BulkIngested:
        """Check and lay out an upload (eroica.service.bulk.prepare), then store it with whatever
        else is being uploaded now (eroica.service.group_commit)."""
        try:
            got = self.uploads.submit(prepare(job_id, docs, name, packed, alone))
        except ServiceError:
            self.metrics.ingest_error("refused")
            raise
        self.metrics.documents.inc(got.created)
        return got

    @property
    def lease_seconds(self) -> float:
        """A claim outlives the longest diagnosis, so no other replica takes a window still being diagnosed."""
        return self.settings.diagnosis_timeout_seconds * 1.25 + 5.0

    def _dispatch(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                if self._localize_hang():          # a hung job waits for nobody: before any window
                    continue
                store.mark_ready(self.eng, s.grace_seconds)
                pk = store.claim(self.eng, s.name, lease_seconds=self.lease_seconds, max_attempts=s.max_attempts)
                if pk is None:
                    store.end_silent(self.eng, s.job_silent_seconds)
                    for iid in assess(self.eng):
                        self.metrics.recovered(self.eng, iid)
                    self._stop.wait(s.poll_seconds)
                    continue
                self._diagnose(pk)
            except Exception as exc:   # one bad window or a database hiccup never stops the loop
                log.warning("eroica serve: dispatch failed: %r", exc)
                self._stop.wait(s.poll_seconds)

    def _localize_hang(self) -> bool:
        """Localize one job whose hang snapshots changed, in the diagnosis worker (eroica.service.hangs);
        whether there was one."""
        assert self.diagnoser is not None
        s = self.settings
        got = hangs.claim(self.eng, s.name, self.lease_seconds)
        if got is None:
            return False
        job_id, _ = got
        try:
            version, text = self.diagnoser.run_hang(s.db_url, job_id, s.diagnosis_timeout_seconds)
            f, changed = hangs.store_verdict(self.eng, job_id, s.name, version, text, s.hang_alert_on)
            if f is not None and changed:
                self.metrics.hang(f)
                log.info("eroica serve: hang of %s: %s %s on ranks %s (%.2f)", job_id, f.state, f.root_cause,
                         f.ranks, f.confidence)
        except Exception as exc:
            log.warning("eroica serve: the hang of %s could not be localized: %r", job_id, exc)
            hangs.release(self.eng, job_id, s.name)
            self._stop.wait(s.poll_seconds)
        return True

    def _diagnose(self, pk: int) -> None:
        """Diagnose one claimed window and store the result; whatever goes wrong on the way (the
        worker dies or hangs, the engine raises, the database refuses the result) puts the window
        back for another attempt, or fails it for good with the reason once it has had its attempts."""
        assert self.diagnoser is not None
        s = self.settings
        w: dict[str, Any] = {"window_id": pk, "job_id": "?"}
        try:
            t0 = time.perf_counter()
            w, history = store.window_and_history(self.eng, pk)
            text = self.diagnoser.run(s.db_url, pk, w["window_id"], history, s.diagnosis_timeout_seconds)
            t1 = time.perf_counter()
            d = Diagnosis.model_validate_json(text)
            if store.store_diagnosis(self.eng, pk, s.name, d):
                self.metrics.diagnosed(w, d, time.time())
            log.info("eroica serve: window %s of %s (%d ranks): diagnosed in %.1f s, stored in %.1f s",
                     w["window_id"], w["job_id"], w["ranks_reported"], t1 - t0, time.perf_counter() - t1)
            return
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"[:1500]
        self.metrics.ingest_error("diagnosis_failed")
        log.warning("eroica serve: window %s of %s could not be diagnosed: %s", w["window_id"], w["job_id"], why)
        try:
            store.release(self.eng, pk, s.name, why, s.max_attempts)
        except Exception as exc:   # the database is down: the lease runs out and the window is claimed again
            log.warning("eroica serve: window %s could not be released: %r", pk, exc)


JOB, WINDOW, HANG = "GET /v1/jobs/{job_id}", "GET /v1/windows/{pk}", "GET /v1/jobs/{job_id}/hang"
#: the API's OpenAPI links: from a response (operation, status) to what a client does next with the values it
#: gives (runtime expressions); e.g. an upload -> its job and window -> the findings -> the issue -> acting on it
LINKS: dict[tuple[str, str], dict[str, tuple[str, dict[str, str]]]] = {
    ("POST /v1/patterns", "201"): {"Job": (JOB, {"job_id": "$request.header.X-Eroica-Job"}),
                                   "Window": (WINDOW, {"pk": "$response.body#/window"})},
    ("POST /v1/jobs/{job_id}/steps", "201"): {"Job": (JOB, {"job_id": "$request.path.job_id"})},
    ("POST /v1/jobs/{job_id}/hang", "201"): {"Hang": (HANG, {"job_id": "$request.path.job_id"})},
    ("POST /v1/jobs/{job_id}/end", "200"): {"Job": (JOB, {"job_id": "$request.path.job_id"}),
                                           "Issues": ("GET /v1/issues", {"job": "$request.path.job_id"})},
    ("POST /v1/jobs/{job_id}/traces", "201"): {
        "Trace": ("GET /v1/jobs/{job_id}/traces/{window_id}/{rank}", {"job_id": "$request.path.job_id",
                                                                      "window_id": "$response.body#/window_id",
                                                                      "rank": "$response.body#/rank"}),
        "Traces": ("GET /v1/jobs/{job_id}/traces", {"job_id": "$request.path.job_id"})},
    ("GET /v1/jobs", "200"): {"Job": (JOB, {"job_id": "$response.body#/0/id"}),
                              "JobPage": ("GET /jobs/{job_id}", {"job_id": "$response.body#/0/id"})},
    (JOB, "200"): {"Window": (WINDOW, {"pk": "$response.body#/windows/0/pk"}),
                   "Diagnosis": ("GET /v1/windows/{pk}/diagnosis", {"pk": "$response.body#/windows/0/pk"}),
                   "Findings": ("GET /v1/findings", {"job": "$response.body#/id"}),
                   "Issues": ("GET /v1/issues", {"job": "$response.body#/id"}),
                   "Hang": (HANG, {"job_id": "$response.body#/id"}),
                   "Traces": ("GET /v1/jobs/{job_id}/traces", {"job_id": "$response.body#/id"}),
                   "Steps": ("POST /v1/jobs/{job_id}/steps", {"job_id": "$response.body#/id"}),
                   "Patterns": ("POST /v1/patterns", {"X-Eroica-Job": "$response.body#/id"})},
    (WINDOW, "200"): {"Diagnosis": ("GET /v1/windows/{pk}/diagnosis", {"pk": "$response.body#/pk"}),
                      "Report": ("GET /windows/{pk}/report", {"pk": "$response.body#/pk"}),
                      "Job": (JOB, {"job_id": "$response.body#/job_id"})},
    ("GET /v1/findings", "200"): {"Window": (WINDOW, {"pk": "$response.body#/0/window_pk"}),
                                  "Job": (JOB, {"job_id": "$response.body#/0/job_id"}),
                                  "HostPage": ("GET /hosts/{host}", {"host": "$response.body#/0/hosts/0"})},
    ("GET /v1/issues", "200"): {"Act": ("POST /v1/issues/{iid}/{action}", {"iid": "$response.body#/0/id"}),
                                "Incident": ("GET /v1/issues/{iid}/incident", {"iid": "$response.body#/0/id"}),
                                "Job": (JOB, {"job_id": "$response.body#/0/job_id"})},
    ("POST /v1/issues/{iid}/{action}", "200"): {
        "Incident": ("GET /v1/issues/{iid}/incident", {"iid": "$response.body#/id"}),
        "Issues": ("GET /v1/issues", {"job": "$response.body#/job_id", "state": "$response.body#/state"})},
    ("GET /v1/hosts", "200"): {"HostPage": ("GET /hosts/{host}", {"host": "$response.body#/0/host"})},
}


def add_links(doc: dict[str, Any]) -> None:
    """LINKS into the document's responses, naming each target by its operationId."""
    ops = {f"{m.upper()} {p}": op for p, item in doc["paths"].items() for m, op in item.items()}
    for (source, status), links in LINKS.items():
        response = ops[source]["responses"][status]
        response["links"] = {name: {"operationId": ops[target]["operationId"], "parameters": params}
                             for name, (target, params) in links.items()}


def openapi(app: FastAPI) -> dict[str, Any]:
    """The published API, with the documents the write routes read themselves (streamed and
    size-checked, so FastAPI cannot see them) as their request bodies' schemas, and its links (LINKS)."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    from eroica.schema.hang import HangSnapshot
    from eroica.schema.patterns import PatternsDoc
    from eroica.schema.steps import StepSeriesSummary
    from eroica.service.inputs import TransitionIn

    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (PatternsDoc, StepSeriesSummary, HangSnapshot, TransitionIn):
        js = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            assert schemas.get(name, sub) == sub, f"two request schemas are named {name}"
            schemas[name] = sub
        schemas[model.__name__] = js
    add_links(doc)
    app.openapi_schema = doc
    return doc


def create_app(settings: Settings, start: bool = True) -> FastAPI:
    svc = Service(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if start:
            svc.start()
        try:
            yield
        finally:
            svc.stop()

    app = FastAPI(title="eroica", version="1", docs_url=None, redoc_url=None, openapi_url="/v1/openapi.json",
                  lifespan=lifespan)
    app.state.svc = svc
    access = Access(settings.token, settings.read_token, settings.job_tokens, settings.allowed_hosts)
    app.state.access = access
    app.add_middleware(Guard, access=access, max_body_bytes=settings.max_body_bytes)

    @app.exception_handler(ServiceError)
    async def _refused(request: Request, exc: ServiceError) -> JSONResponse:
        log.warning("eroica serve: %s %s refused (%d): %s", request.method, request.url.path, exc.status, exc.message)
        return JSONResponse({"error": exc.message, "field": exc.field}, status_code=exc.status)

    @app.exception_handler(sa.exc.OperationalError)
    async def _unavailable(request: Request, exc: sa.exc.OperationalError) -> JSONResponse:
        # the database is down, full or locked for too long: nothing was stored; the sink retries (and spools)
        why = str(exc.orig)[:200] if exc.orig is not None else type(exc).__name__
        log.warning("eroica serve: %s %s: the database is unavailable (503): %s", request.method, request.url.path,
                    why)
        return JSONResponse({"error": f"the database is unavailable, nothing was stored; retry later ({why})",
                             "field": "database"}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a request FastAPI could not bind (a path or query parameter, a body model) is invalid: 422
        problem = first_problem(exc.errors(), default_field="request")
        return await _refused(request, Invalid(problem.message, problem.field))

    app.include_router(api_router(svc))
    app.include_router(issue_router(svc))
    app.include_router(traces.router(svc))
    app.include_router(pages.router(svc))
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]

    @app.get("/metrics")
    def _metrics() -> Response:
        body, ctype = svc.metrics.render()
        return Response(body, media_type=ctype)

    @app.get("/healthz")
    async def _health() -> dict[str, str]:
        return {"status": "ok"}      # on the event loop, never behind a blocked worker thread

    return app

