"""The ASGI app of `eroica serve`: the versioned API (`/v1/...`), the pages, `/metrics`, and the
background loops (dispatcher: ready windows -> worker process -> stored diagnosis; watcher)."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from eroica.engine.diagnosis import Diagnosis
from eroica.engine.errors import RunDirError
from eroica.engine.load import parse_doc
from eroica.service import pages, store
from eroica.service.db import make_engine, migrate
from eroica.service.metrics import ServiceMetrics
from eroica.service.recovery import assess
from eroica.service.routes import api_router, issue_router
from eroica.service.worker import Diagnoser

log = logging.getLogger("eroica.service")


@dataclass
class Settings:
    db_url: str
    token: str | None = None                 # writes need it; reads too when read_token is set
    read_token: bool = False
    max_body_bytes: int = 8 * 1024 * 1024    # after decompression
    grace_seconds: float = 30.0              # a window with missing ranks is diagnosed this long after its last one
    watch: list[Path] = field(default_factory=list)
    knowledge_dirs: list[str] = field(default_factory=list)
    workers: int = 1
    poll_seconds: float = 0.5
    job_silent_seconds: float = 900.0        # a run that sent nothing this long ended (killed without closing)
    alerts: Any = None                       # an AlertConfig (eroica.service.alerts), or no alerting
    drain_min_jobs: int = 3                  # a host drains when confident hardware findings name it in this many jobs
    drain_min_confidence: float = 0.5

    def __post_init__(self) -> None:
        if self.job_silent_seconds <= 0:
            raise ValueError(f"job_silent_seconds must be positive, got {self.job_silent_seconds}")
        if self.drain_min_jobs < 1:
            raise ValueError(f"drain_min_jobs must be at least 1, got {self.drain_min_jobs}")
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
        self.diagnoser: Diagnoser | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.diagnoser = Diagnoser(self.settings.workers)
        self._threads = [threading.Thread(target=self._dispatch, name="eroica-dispatch", daemon=True)]
        if self.settings.watch:
            from eroica.service.watch import Watcher

            watcher = Watcher(self, self.settings.watch)
            self._threads.append(threading.Thread(target=watcher.run, args=(self._stop,), name="eroica-watch",
                                                  daemon=True))
        if self.settings.alerts is not None:
            from eroica.service.alerts import Deliverer

            deliverer = Deliverer(self.eng, self.settings.alerts)
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

    def accept(self, job_id: str, body: bytes, where: str, name: str | None = None) -> store.Ingested:
        """Validate and store one document (the API and the watcher both come here)."""
        try:
            doc = parse_doc(body, where)
        except RunDirError as exc:
            self.metrics.ingest_error("invalid")
            raise store.IngestError(400 if exc.field != "schema" else 422, exc.message, exc.field or "") from exc
        except ValidationError as exc:
            self.metrics.ingest_error("invalid")
            err = exc.errors()[0]
            raise store.IngestError(422, err["msg"], ".".join(str(x) for x in err["loc"])) from exc
        try:
            got = store.ingest(self.eng, job_id, doc, body, name=name)
        except store.IngestError:
            self.metrics.ingest_error("refused")
            raise
        if got.created:
            self.metrics.documents.inc()
        return got

    def _dispatch(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                store.mark_ready(self.eng, s.grace_seconds)
                pk = store.claim(self.eng, s.name)
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

    def _diagnose(self, pk: int) -> None:
        assert self.diagnoser is not None
        w, docs, history = store.window_docs(self.eng, pk)
        try:
            text = self.diagnoser.submit(w["window_id"], docs, history, self.settings.knowledge_dirs).result()
            d = Diagnosis.model_validate_json(text)
        except Exception as exc:
            store.fail(self.eng, pk, self.settings.name, repr(exc))
            self.metrics.ingest_error("diagnosis_failed")
            log.warning("eroica serve: window %s of %s could not be diagnosed: %r", w["window_id"], w["job_id"], exc)
            return
        if store.store_diagnosis(self.eng, pk, self.settings.name, d):
            self.metrics.diagnosed(w, d, time.time())


class _BodyLimit(BaseHTTPMiddleware):
    def __init__(self, app: Any, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.limit:
            log.warning("eroica serve: %s %s refused (413): body of %s bytes over %d", request.method,
                        request.url.path, size, self.limit)
            return JSONResponse({"error": f"body over {self.limit} bytes", "field": "body"}, status_code=413)
        return await call_next(request)


FORM_ACTION = re.compile(r"/issues/[0-9]+/act")


def authorized(request: Request, token: str | None) -> bool:
    if token is None:
        return True
    got = request.headers.get("authorization", "")
    return got.startswith("Bearer ") and hmac.compare_digest(got.removeprefix("Bearer ").encode(), token.encode())


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
    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(store.IngestError)
    async def _refused(request: Request, exc: store.IngestError) -> JSONResponse:
        log.warning("eroica serve: %s %s refused (%d): %s", request.method, request.url.path, exc.status, exc.message)
        return JSONResponse({"error": exc.message, "field": exc.field}, status_code=exc.status)

    @app.middleware("http")
    async def _auth(request: Request, call_next: RequestResponseEndpoint) -> Response:
        # the job page's forms carry the token in their body (a browser cannot send the header): checked there
        writes = request.method not in ("GET", "HEAD") and not FORM_ACTION.fullmatch(request.url.path)
        needs = writes or (settings.read_token and request.url.path not in ("/healthz", "/metrics"))
        if needs and not authorized(request, settings.token):
            log.warning("eroica serve: %s %s: missing or wrong bearer token", request.method, request.url.path)
            return JSONResponse({"error": "missing or wrong bearer token", "field": "authorization"}, status_code=401)
        return await call_next(request)

    app.include_router(api_router(svc))
    app.include_router(issue_router(svc))
    app.include_router(pages.router(svc))

    @app.get("/metrics")
    def _metrics() -> Response:
        body, ctype = svc.metrics.render()
        return Response(body, media_type=ctype)

    @app.get("/healthz")
    def _health() -> dict[str, str]:
        return {"status": "ok"}

    return app

