"""Alerts: one per issue (job, root cause, ranks), sent when it opens, updated when later windows see
it again, resolved when it is closed. Routed by the taxonomy's category (hardware to the fleet's
on-call, software to the job's owners) to the Prometheus Alertmanager v2 API, a JSON webhook (the
Alertmanager webhook format) or a Slack-compatible incoming webhook. Delivery runs on its own thread
with a bounded retry and backoff; its state is stored on the issue, so a sink that is down or slow
never holds up a diagnosis and the pages show what was not delivered.

    schema: eroica.alerts/v1
    external_url: http://eroica.example:8080        # links in alerts point here
    routes:
      - {name: fleet-oncall, match: {category: hardware}, kind: alertmanager, url: http://am:9093}
      - {name: job-owners, match: {category: software}, kind: slack, url: https://hooks.slack.com/...}
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eroica.collector.sink import post_with_retry
from eroica.service.db import issues, jobs, reading, writing

log = logging.getLogger("eroica.service")
SCHEMA = "eroica.alerts/v1"
RESOLVED = ("recovered", "false_positive")


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    match: dict[Literal["category", "root_cause", "job"], str] = Field(default_factory=dict)
    kind: Literal["alertmanager", "webhook", "slack"]
    url: str = Field(pattern=r"^https?://")
    timeout_seconds: float = Field(5.0, gt=0, le=60)
    attempts: int = Field(3, ge=1, le=10)

    @property
    def longest_seconds(self) -> float:
        """The longest one delivery can take: every attempt's timeout and the backoff between them
        (0.5 s, doubling: eroica.collector.sink.post_with_retry)."""
        return self.attempts * self.timeout_seconds + 0.5 * (2 ** (self.attempts - 1) - 1)


class AlertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_: Literal["eroica.alerts/v1"] = Field(alias="schema")
    external_url: str = "http://127.0.0.1:8080"
    routes: list[Route] = Field(min_length=1)
    retry_seconds: float = Field(30.0, gt=0)    # a failed delivery is tried again this much later (doubling)
    # Alertmanager resolves a firing alert at its endsAt unless it is sent again: an open issue's alert to an
    # alertmanager route is sent again this often, each time ending 4 of these later (as Prometheus does)
    resend_seconds: float = Field(3600.0, ge=10, le=86400)


def load_alerts(path: Path) -> AlertConfig:
    """The alert file, validated: every problem with the file and the field, and what to do."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the alert file: {exc}") from exc
    try:
        return AlertConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{path}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                                   for e in exc.errors())) from exc


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def alert_of(i: dict[str, Any], cfg: AlertConfig, now: float) -> dict[str, Any]:
    """The Alertmanager v2 alert for an issue: stable labels (its identity), the rest in annotations."""
    ended = i.get("job_ended_at") is not None and i["state"] not in RESOLVED
    resolved = i["state"] in RESOLVED or ended
    return {
        "labels": {"alertname": "EroicaFinding", "job": i["job_id"], "root_cause": i["root_cause"],
                   "category": i["category"], "host": (i["hosts"] or [""])[0], "ranks": i["ranks"],
                   "device": (i.get("devices") or ["/"])[0].split("/", 1)[1],
                   "severity": "critical" if i["category"] == "hardware" else "warning"},
        "annotations": {"summary": f"{i['root_cause']} on rank(s) {i['ranks']} of job {i['job_id']}",
                        "function": i["function"] or "", "confidence": f"{i['top_confidence']:.2f}",
                        "windows": str(i["windows_total"]), "state": i["state"], "issue": str(i["id"]),
                        "job_ended": f"by {i.get('job_ended_by')}" if ended else "",
                        "link": i["link_url"] or ""},
        "startsAt": _iso(i["first_seen"]),
        "endsAt": _iso(now if resolved else now + 4 * cfg.resend_seconds),
        "generatorURL": f"{cfg.external_url.rstrip('/')}/jobs/{i['job_id']}",
    }


def payload(route: Route, alert: dict[str, Any], cfg: AlertConfig) -> tuple[str, dict[str, Any] | list[Any]]:
    if route.kind == "alertmanager":
        return route.url.rstrip("/") + "/api/v2/alerts", [alert]
    status = "resolved" if alert["endsAt"] <= _iso(time.time()) else "firing"
    if route.kind == "webhook":
        return route.url, {"version": "4", "status": status, "receiver": route.name, "groupLabels": {},
                           "commonLabels": alert["labels"], "commonAnnotations": alert["annotations"],
                           "externalURL": cfg.external_url, "truncatedAlerts": 0,
                           "alerts": [{**alert, "status": status}]}
    a = alert["annotations"]
    text = (f"[{status.upper()}] {a['summary']} (confidence {a['confidence']}, {a['windows']} window(s), "
            f"{a['state']}) {alert['generatorURL']}")
    return route.url, {"text": text[:2900]}


class Deliverer:
    """Sends the alerts of dirty issues; one thread per replica, never in the diagnosis's way.

    An issue's alert is claimed before it is sent (a lease on the row), so replicas do not send it
    twice; and it is marked sent only for the version that was sent: a change made while the alert
    was on the wire bumps the version, and the next round sends it again."""

    CLAIM_SECONDS = 120.0

    def __init__(self, eng: sa.Engine, cfg: AlertConfig, name: str = "eroica") -> None:
        self.eng, self.cfg, self.name = eng, cfg, name[:64]
        # the claim outlives the slowest route's longest delivery twice over: another replica never sends an
        # alert that is still on the wire (10 attempts of 60 s and their backoff: 855 s)
        self.claim_seconds = max(self.CLAIM_SECONDS, 2 * max(r.longest_seconds for r in cfg.routes))

    def route(self, i: dict[str, Any]) -> Route | None:
        keys = {"category": i["category"], "root_cause": i["root_cause"], "job": i["job_id"]}
        return next((r for r in self.cfg.routes if all(keys[k] == v for k, v in r.match.items())), None)

    def send(self, route: Route, body: tuple[str, Any]) -> str | None:
        url, data = body
        req = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        return post_with_retry(req, route.attempts, route.timeout_seconds, route.name)

    def _due(self, now: float) -> Any:
        return sa.and_(issues.c.alert_dirty.is_(True),
                       sa.or_(issues.c.alert_next_at.is_(None), issues.c.alert_next_at <= now),
                       sa.or_(issues.c.alert_claim_until.is_(None), issues.c.alert_claim_until < now))

    def _claim(self, iid: int, now: float) -> dict[str, Any] | None:
        """This replica's claim on the issue's alert, and the issue as claimed; None when another has it."""
        with writing(self.eng) as c:
            got = c.execute(issues.update().where(issues.c.id == iid, self._due(now)).values(
                alert_claimed_by=self.name, alert_claim_until=now + self.claim_seconds)).rowcount
            if not got:
                return None
            row = c.execute(sa.select(issues, jobs.c.ended_at.label("job_ended_at"),
                                      jobs.c.ended_by.label("job_ended_by"))
                            .join(jobs, jobs.c.id == issues.c.job_id, isouter=True)
                            .where(issues.c.id == iid)).mappings().one()
        return dict(row)

    def refresh(self, now: float) -> int:
        """Mark for sending again the open issues whose alert went to an Alertmanager longer than
        resend_seconds ago (a webhook or Slack gets an alert once per change, never a reminder)."""
        t = issues.c
        with reading(self.eng) as c:
            rows = c.execute(sa.select(t.id, t.category, t.root_cause, t.job_id).join(jobs, jobs.c.id == t.job_id)
                             .where(t.alert_dirty.is_(False), t.alert_state == "delivered", t.state.notin_(RESOLVED),
                                    t.alert_sent_at < now - self.cfg.resend_seconds, jobs.c.ended_at.is_(None))
                             .limit(1000)).mappings().all()
        stale = [r["id"] for r in rows if (route := self.route(dict(r))) is not None and route.kind == "alertmanager"]
        if stale:
            with writing(self.eng) as c:
                c.execute(issues.update().where(t.id.in_(stale), t.alert_dirty.is_(False))
                          .values(alert_dirty=True, alert_version=t.alert_version + 1))
        return len(stale)

    def round(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        self.refresh(now)
        with reading(self.eng) as c:
            ids = list(c.execute(sa.select(issues.c.id).where(self._due(now)).order_by(issues.c.id)).scalars())
        for iid in ids:
            i = self._claim(iid, now)
            if i is None:
                continue
            route = self.route(i)
            if route is None:
                upd: dict[str, Any] = {"alert_state": "unrouted", "alert_error": "no route matches"}
                done = True
            else:
                why = self.send(route, payload(route, alert_of(i, self.cfg, time.time()), self.cfg))
                attempts = i["alert_attempts"] + 1
                done = why is None
                if why is None:
                    upd = {"alert_state": "delivered", "alert_error": None, "alert_sent_at": time.time(),
                           "alert_attempts": attempts, "alert_next_at": None}
                else:
                    log.warning("eroica serve: alert for issue %s not delivered: %s", i["id"], why)
                    upd = {"alert_state": "failed", "alert_error": why[:2000], "alert_attempts": attempts,
                           "alert_next_at": time.time() + self.cfg.retry_seconds * 2 ** min(attempts - 1, 6)}
            if done:    # still dirty if the issue changed while its alert was on the wire
                upd["alert_dirty"] = issues.c.alert_version != i["alert_version"]
            with writing(self.eng) as c:
                c.execute(issues.update().where(issues.c.id == iid, issues.c.alert_claimed_by == self.name)
                          .values(alert_claimed_by=None, alert_claim_until=None, **upd))
        return len(ids)

    def run(self, stop: threading.Event, every: float = 0.5) -> None:
        while not stop.is_set():
            try:
                self.round()
            except Exception as exc:   # the database or a route hiccups: the next round tries again
                log.warning("eroica serve: alert delivery: %r", exc)
            stop.wait(every)
