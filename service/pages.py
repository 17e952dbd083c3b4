"""Server-rendered pages (no JavaScript, no external requests): the fleet, a job with its issues, a
host, and each window's full report (the same HTML report `eroica diagnose --format html` writes).

A job's issues are driven from its page with plain HTML forms (acknowledge, link, close), which post
to `/issues/{id}/act` with the service's token typed in a password field (a browser cannot send the
API's bearer header from a form), or with the session `/login` sets: an HttpOnly, SameSite=Strict
cookie that no other site's page can send, and the guard refuses writes from another Origin."""

from __future__ import annotations

import hmac
import time
import urllib.parse
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any

import jinja2
import sqlalchemy as sa
from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from eroica.engine import render
from eroica.schema.diagnosis import Diagnosis
from eroica.service import hangs, store
from eroica.service.db import (
    findings,
    host_counts,
    hosts_of,
    issues,
    jobs,
    reading,
    steps,
    traces_of,
    windows,
)
from eroica.service.errors import NotFound, ServiceError, Unauthorized
from eroica.service.fleet import host_ranking, week_summary
from eroica.service.guard import COOKIE, SESSION_SECONDS, principal_of, read_limited
from eroica.service.lifecycle import LINK_KINDS, state_of, transition
from eroica.service.routes import JobId, Key, window_json

if TYPE_CHECKING:
    from eroica.service.app import Service

HOSTS_LISTED = 100       # a job page names this many of its hosts, then says how many more
_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(lambda n: (resources.files("eroica.service") / "templates" / n).read_text()),
    autoescape=True, undefined=jinja2.StrictUndefined)


def _ago(t: float | None) -> str:
    """A time as a person reads it on a live page: how long ago (UTC clock time beyond a day)."""
    if t is None:
        return ""
    s = time.time() - float(t)
    if s < 90:
        return f"{max(0, int(s))} s ago"
    if s < 5400:
        return f"{int(s // 60)} min ago"
    if s < 86400:
        return f"{s / 3600:.1f} h ago"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(t)))


_ENV.filters["ago"] = _ago


def step_plot(series: list[dict[str, Any]], wins: list[dict[str, Any]], width: int = 1040, height: int = 200
              ) -> dict[str, Any]:
    """An SVG-ready step-time plot: the always-on series (median and p90) with each window's steps marked.
    Without a series, the windows' own step spans are still drawn on the step axis."""
    xs = [s["first_step"] for s in series] + [s["last_step"] for s in series] + \
         [w["start_step"] for w in wins] + [w["end_step"] for w in wins]
    if not xs:
        return {"empty": True, "width": width, "height": height}
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    ymax = max([s["p90_seconds"] for s in series] or [1.0]) * 1.15
    pad = 40

    def x(v: float) -> float:
        return round(pad + (v - x0) / (x1 - x0) * (width - pad - 10), 1)

    def y(v: float) -> float:
        return round(height - 20 - v / ymax * (height - 35), 1)

    mid = [((s["first_step"] + s["last_step"]) / 2, s) for s in series]
    return {
        "empty": False, "width": width, "height": height,
        "median": " ".join(f"{x(m)},{y(s['median_seconds'])}" for m, s in mid),
        "p90": " ".join(f"{x(m)},{y(s['p90_seconds'])}" for m, s in mid),
        "windows": [{"x": x(w["start_step"]), "w": max(2.0, x(w["end_step"]) - x(w["start_step"])),
                     "id": w["window_id"], "status": w["status"]} for w in wins],
        "ymax_ms": round(ymax * 1000), "x0": x0, "x1": x1,
    }


def _form(body: bytes) -> dict[str, str]:
    return {k: v[-1].strip() for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace"),
                                                                keep_blank_values=True).items()}


def _local(path: str) -> str:
    """A path on this service to go back to, never another site (`//evil`, `/\\evil`, `http://...`)."""
    return path if path.startswith("/") and not path.startswith(("//", "/\\")) and "\\" not in path else "/"


def router(svc: Service) -> APIRouter:
    r = APIRouter()
    eng = svc.eng

    def page(name: str, http_status: int = 200, **kw: Any) -> HTMLResponse:
        return HTMLResponse(_ENV.get_template(name).render(http_status=http_status, sessions=svc.settings.token
                                                           is not None, **kw), status_code=http_status)

    @r.get("/", response_class=HTMLResponse)
    def fleet() -> HTMLResponse:
        with reading(eng) as c:
            rows = c.execute(sa.select(jobs).order_by(jobs.c.last_seen.desc()).limit(200)).mappings().all()
            counts = host_counts(c, [j["id"] for j in rows])
            js = [{**j, "hosts_total": counts[j["id"]]} for j in rows]
            fs = c.execute(sa.select(findings).where(findings.c.confidence >= 0.5)
                           .order_by(findings.c.created_at.desc()).limit(500)).mappings().all()
            undelivered = c.execute(sa.select(issues).where(issues.c.alert_state == "failed")
                                    .order_by(issues.c.last_seen.desc()).limit(50)).mappings().all()
            status: dict[str, int] = dict(c.execute(
                sa.select(windows.c.status, sa.func.count()).group_by(windows.c.status)).all())
        by_cause = Counter((f["root_cause"], f["category"]) for f in fs)
        latest: dict[str, Any] = {}
        for f in fs:
            latest.setdefault(f["job_id"], f)
        week = week_summary(eng, time.time() - 7 * 86400, time.time() + 1)
        return page("fleet.html.j2", jobs=js, by_cause=by_cause.most_common(), latest=latest, status=status,
                    findings=fs[:30], undelivered=undelivered, week=week)

    @r.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(job_id: JobId, request: Request) -> HTMLResponse:
        store.valid_job_id(job_id)
        with reading(eng) as c:
            row = c.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().first()
            if row is None:
                raise NotFound(f"no job {job_id!r}", "job")
            hosts = hosts_of(c, [job_id])[job_id]
            j = {**row, "hosts": hosts[:HOSTS_LISTED], "hosts_total": len(hosts)}
            ws = [window_json(w) for w in c.execute(sa.select(windows).where(windows.c.job_id == job_id)
                                                    .order_by(windows.c.start_step)).mappings()]
            series = [dict(s) for s in c.execute(sa.select(steps).where(steps.c.job_id == job_id)
                                                 .order_by(steps.c.first_step)).mappings()]
            fs = c.execute(sa.select(findings).where(findings.c.job_id == job_id)
                           .order_by(findings.c.confidence.desc())).mappings().all()
            runs = sa.select(jobs.c.id).where(jobs.c.name == (j["name"] or job_id))
            iss = [i for i in c.execute(sa.select(issues).where(issues.c.job_id.in_(runs))
                                        .order_by(issues.c.last_seen.desc())).mappings()
                   if i["job_id"] == job_id or job_id in (i["runs"] or [])]
            kept = traces_of(c, job_id)
            culprits = store.story_of(c, job_id)
        by_window: dict[int, list[Any]] = {}
        for f in fs:
            by_window.setdefault(f["window_pk"], []).append(f)
        return page("job.html.j2", job=j, windows=ws, by_window=by_window, plot=step_plot(series, ws), issues=iss,
                    story=culprits,
                    hang=hangs.current(eng, job_id)[0],
                    traces=kept, link_kinds=LINK_KINDS, needs_token=svc.settings.token is not None
                    and principal_of(request).kind not in ("admin", "session"))

    @r.post("/issues/{iid}/act", response_model=None)
    async def act(iid: Key, request: Request) -> Response:
        """An issue's transition from its job page's form; back to the page, or the refusal in words."""
        form = _form(await read_limited(request, 65536))
        token = svc.settings.token
        back = form.get("back", "/")
        back = back if back.startswith("/jobs/") and "//" not in back and "\\" not in back else "/"
        signed_in = principal_of(request).kind in ("admin", "session", "open")
        try:
            if not signed_in and (token is None or not hmac.compare_digest(form.get("token", "").encode(),
                                                                             token.encode())):
                raise Unauthorized("the service's token is missing or wrong", "token")
            await run_in_threadpool(transition, eng, iid, state_of(form.get("action", "")), form.get("who", ""),
                                    form.get("why") or None, form.get("url") or None, form.get("kind") or None)
        except ServiceError as exc:
            return page("refused.html.j2", http_status=exc.status, why=exc.message, field=exc.field, back=back)
        return RedirectResponse(f"{back}#issue-{iid}", status_code=303)

    @r.get("/login", response_class=HTMLResponse)
    def login_form(next: str = "/") -> HTMLResponse:
        return page("login.html.j2", next=_local(next), failed=False)

    @r.post("/login", response_model=None)
    async def login(request: Request) -> Response:
        """The service token typed once; a session cookie for the pages (reads and their forms)."""
        form = _form(await read_limited(request, 8192))
        token, nxt = svc.settings.token, _local(form.get("next", "/"))
        if token is None:
            return RedirectResponse(nxt, status_code=303)
        if not hmac.compare_digest(form.get("token", "").encode(), token.encode()):
            return page("login.html.j2", http_status=401, next=nxt, failed=True)
        resp = RedirectResponse(nxt, status_code=303)
        resp.set_cookie(COOKIE, request.app.state.access.session_value(), max_age=SESSION_SECONDS, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https", path="/")
        return resp

    @r.post("/logout", response_model=None)
    async def logout(request: Request) -> Response:
        """The session cookie cleared in this browser (a session is signed, not stored: it ends at its expiry
        everywhere else)."""
        await read_limited(request, 8192)
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
        return resp

    @r.get("/hosts", response_class=HTMLResponse)
    def hosts() -> HTMLResponse:
        s = svc.settings
        return page("hosts.html.j2", hosts=host_ranking(eng, s.drain_min_confidence), min_jobs=s.drain_min_jobs)

    @r.get("/hosts/{host}", response_class=HTMLResponse)
    def host(host: Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")]) -> HTMLResponse:
        with reading(eng) as c:
            fs = store.findings_where(c, sa.select(findings).where(findings.c.confidence >= 0.5), 5000, host)
        by_cause = Counter(f["root_cause"] for f in fs)
        return page("host.html.j2", host=host, findings=fs, by_cause=by_cause.most_common(),
                    jobs=sorted({f["job_id"] for f in fs}))

    @r.get("/windows/{pk}/report", response_class=HTMLResponse)
    def report(pk: Key) -> HTMLResponse:
        body = store.diagnosis_of(eng, pk)
        if body is None:
            raise NotFound(f"window {pk} has no diagnosis (yet)", "window")
        return HTMLResponse(render(Diagnosis.model_validate_json(body), "html"))

    return r
