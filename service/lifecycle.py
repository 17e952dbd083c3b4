"""A finding's lifecycle: the findings of one job, root cause and ranks across windows are one
issue (one ticket, one alert), which people move through

    open -> acknowledged (who, when) -> linked (a ticket, a change request, a commit, a config change)
         -> recovered | not_recovered | false_positive (who, why)

Every transition is checked and kept in the issue's history. A false positive is data: it exports
in the incident format (`incidents/<ID>/patterns`, `expected.yaml` saying the cause must not be
reported on those ranks), so it becomes a regression case for the rules.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
import yaml

from eroica.schema.diagnosis import Diagnosis
from eroica.service.db import documents, issues, jobs, reading, windows, writing
from eroica.service.docs import doc_texts
from eroica.service.errors import Conflict, Invalid, NotFound
from eroica.service.runs import insert_or_get

CONFIDENT = 0.5
CLOSED = ("recovered", "not_recovered", "false_positive")
OPEN_STATES = ("open", "acknowledged", "linked")
NEXT = {"acknowledged": ("open",), "linked": ("open", "acknowledged", "linked"),
        **{s: ("open", "acknowledged", "linked") for s in CLOSED}}
LINK_KINDS = ("ticket", "change_request", "commit", "config")
# the issue's alert must be (re)sent: its version moves, so a delivery in flight does not clear it
RESEND = {"alert_dirty": True, "alert_version": issues.c.alert_version + 1}


def state_of(action: str) -> str:
    """The state an action (the API's path, the page's form) moves an issue to: ack, link, or a state."""
    return {"ack": "acknowledged", "link": "linked"}.get(action, action)


def _issue_of(c: sa.Connection, job_id: str, root_cause: str, ranks: str) -> Any:
    """The issue of this run, else the latest of an earlier run of the same job name (a restart)."""
    q = sa.select(issues).where(issues.c.root_cause == root_cause, issues.c.ranks == ranks)
    row = c.execute(q.where(issues.c.job_id == job_id)).mappings().first()
    if row is not None:
        return row
    name = sa.select(jobs.c.name).where(jobs.c.id == job_id).scalar_subquery()
    runs = sa.select(jobs.c.id).where(jobs.c.name == name, jobs.c.id != job_id)
    return c.execute(q.where(issues.c.job_id.in_(runs)).order_by(issues.c.last_seen.desc())).mappings().first()


def _devices(c: sa.Connection, pk: int, ranks: list[int]) -> list[str]:
    """The devices of a finding's ranks, as their documents say: "host/device" ("node-7/cuda:3")."""
    out = set()
    hosts = dict(c.execute(sa.select(documents.c.rank, documents.c.host).where(
        documents.c.window_pk == pk, documents.c.rank.in_(ranks))).all())
    for rank, text in doc_texts(c, pk, ranks).items():
        try:
            out.add(f"{hosts[rank]}/{json.loads(text)['job'].get('device', 'unknown')}")
        except (OSError, ValueError, KeyError, TypeError):
            out.add(f"{hosts[rank]}/unknown")
    return sorted(out)


def open_issue(c: sa.Connection, job_id: str, root_cause: str, category: str, ranks: str, function: str | None,
               confidence: float, now: float, hosts: list[str] | None = None, devices: list[str] | None = None,
               window_pk: int = 0, why: str | None = None) -> int:
    """A new open issue (its alert still to send) with its first history entry: from a window's
    finding (`window_pk`), or from a hang, which no window saw (`why`)."""
    entry: dict[str, Any] = {"state": "open", "who": "eroica", "at": now}
    if window_pk:
        entry["window"] = window_pk
    if why:
        entry["why"] = why
    return insert_or_get(c, issues, {          # another replica's window or hang may open it at the same moment
        "job_id": job_id, "root_cause": root_cause, "category": category, "ranks": ranks, "hosts": hosts or [],
        "function": function, "first_seen": now, "last_seen": now, "windows_total": 1 if window_pk else 0,
        "top_confidence": confidence, "last_window_pk": window_pk, "state": "open", "alert_dirty": True,
        "runs": [job_id], "devices": devices or [], "history": [entry]}, ["job_id", "root_cause", "ranks"], "id")


def record_findings(c: sa.Connection, pk: int, job_id: str, d: Diagnosis, now: float) -> list[int]:
    """Fold a window's confident findings into the job's issues (inside the diagnosis's transaction);
    the ids of the issues this window touched."""
    touched = []
    for wd in d.windows:
        for f in wd.findings:
            if f.confidence >= CONFIDENT:
                touched.append(fold_finding(c, job_id, f.root_cause, f.category.value, sorted(f.ranks), f.function,
                                            f.confidence, now, hosts=f.hosts, devices=_devices(c, pk, f.ranks),
                                            window_pk=pk))
    return touched


def fold_finding(c: sa.Connection, job_id: str, root_cause: str, category: str, ranks: list[int],
                 function: str | None, confidence: float, now: float, hosts: list[str] | None = None,
                 devices: list[str] | None = None, window_pk: int = 0, why: str | None = None,
                 resend: bool = True) -> int:
    """A finding into the job's issue of that root cause and ranks: opened, or seen again (a closed
    issue that shows up again is reopened; one of an earlier run of the same job name is followed into
    this run: the job restarted). From a window's diagnosis (`window_pk`) or from a hang, which no
    window saw (`why`). `resend`: the alert goes out again with the update (each window; a hang's
    repeated snapshots only when they reopen it). The issue's id."""
    key = ",".join(map(str, ranks))
    row = _issue_of(c, job_id, root_cause, key)
    if row is None:
        return open_issue(c, job_id, root_cause, category, key, function, confidence, now, hosts=hosts,
                          devices=devices, window_pk=window_pk, why=why)
    iid = int(row["id"])
    new_window = bool(window_pk) and row["last_window_pk"] != window_pk
    upd: dict[str, Any] = {"last_seen": now, "windows_total": row["windows_total"] + new_window,
                           "top_confidence": max(row["top_confidence"], confidence),
                           "hosts": sorted(set(row["hosts"]) | set(hosts or [])),
                           "devices": sorted(set(row["devices"] or []) | set(devices or []))}
    if resend:
        upd.update(RESEND)
    if window_pk:
        upd["last_window_pk"] = window_pk
    history = list(row["history"])
    if row["job_id"] != job_id:
        upd.update(job_id=job_id, runs=[*(row["runs"] or [row["job_id"]]), job_id])
        history.append({"state": row["state"], "who": "eroica", "at": now, "run": job_id,
                        "why": f"the job restarted: followed from run {row['job_id']} to {job_id}"})
    if row["state"] in ("recovered", "false_positive"):
        upd.update(state="open", **RESEND)
        entry: dict[str, Any] = {"state": "open", "who": "eroica", "at": now,
                                 "why": f"seen again after {row['state']}" + (f" ({why})" if why else "")}
        if window_pk:
            entry["window"] = window_pk
        history.append(entry)
    if len(history) != len(row["history"]):
        upd["history"] = history
    c.execute(issues.update().where(issues.c.id == iid).values(**upd))
    return iid


def transition(eng: sa.Engine, iid: int, state: str, who: str, why: str | None = None, url: str | None = None,
               kind: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Move an issue to `state`; a 4xx (ServiceError) naming the field when the move is not allowed."""
    now = time.time() if now is None else now
    if state not in NEXT:
        raise Invalid(f"unknown state {state!r}; one of {', '.join(NEXT)}", "state")
    if not who or len(who) > 200:
        raise Invalid("say who does this (1-200 characters)", "who")
    if state == "linked":
        if not url or len(url) > 2000:
            raise Invalid("a link needs the ticket or change (URL or id, up to 2000 characters)", "url")
        if kind not in LINK_KINDS:
            raise Invalid(f"link kind must be one of {', '.join(LINK_KINDS)}", "kind")
    if state == "false_positive" and not why:
        raise Invalid("closing as a false positive needs the reason (it becomes a regression case)", "why")
    with writing(eng) as c:
        row = c.execute(sa.select(issues).where(issues.c.id == iid)).mappings().first()
        if row is None:
            raise NotFound(f"no issue {iid}", "issue")
        if row["state"] not in NEXT[state]:
            raise Conflict(f"issue {iid} is {row['state']}: it cannot become {state}", "state")
        entry: dict[str, Any] = {"state": state, "who": who, "at": now}
        entry.update({k: v for k, v in (("why", why), ("url", url)) if v})
        upd: dict[str, Any] = {"state": state, "history": [*row["history"], entry], **RESEND}
        if state == "linked":
            upd.update(link_url=url, link_kind=kind)
        c.execute(issues.update().where(issues.c.id == iid).values(**upd))
        return dict(c.execute(sa.select(issues).where(issues.c.id == iid)).mappings().one())


def export_false_positive(eng: sa.Engine, iid: int) -> dict[str, Any]:
    """An issue closed as a false positive in the incident format: the window's documents, an
    expected.yaml that forbids the cause on those ranks, and a context.yaml saying where it came from."""
    with reading(eng) as c:
        row = c.execute(sa.select(issues).where(issues.c.id == iid)).mappings().first()
        if row is None:
            raise NotFound(f"no issue {iid}", "issue")
        if row["state"] != "false_positive":
            raise Conflict(f"issue {iid} is {row['state']}, not a false positive", "state")
        w = c.execute(sa.select(windows.c.window_id, windows.c.job_id).where(
            windows.c.pk == row["last_window_pk"])).one()
        docs = [t.decode() for _, t in sorted(doc_texts(c, row["last_window_pk"]).items())]
    ranks = [int(x) for x in row["ranks"].split(",")]
    why = next((h.get("why") for h in reversed(row["history"]) if h["state"] == "false_positive"), "")
    expected = {"expect": [], "must_not": [{"root_cause": row["root_cause"]}],
                "min_confidence": CONFIDENT}
    context = {"source": f"eroica serve: issue {iid}, closed as a false positive", "job": {"name": w.job_id},
               "window": w.window_id, "ranks": ranks, "why": why}
    return {"window": w.window_id, "documents": docs, "expected_yaml": yaml.safe_dump(expected, sort_keys=False),
            "context_yaml": yaml.safe_dump(context, sort_keys=False)}
