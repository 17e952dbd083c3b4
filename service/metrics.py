"""Prometheus metrics of one service replica (`/metrics`), in its own registry: documents in,
ingestion errors, windows diagnosed, findings by root cause, time to diagnosis; and, read from the
database at each scrape, the queue depth and the loop's numbers (issues by state, the week's
medians to detect, localize and mitigate, accelerator-hours given back)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from eroica.schema.diagnosis import Diagnosis
from eroica.schema.hang import HangFinding
from eroica.service.db import hang_verdicts, issues, jobs, reading, windows
from eroica.service.fleet import week_summary

disable_created_metrics()    # no `_created` gauge beside every counter

# from the last rank's document to the stored diagnosis; windows are minutes apart, diagnoses seconds
TTD_BUCKETS = (0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)


class _Queue(Collector):
    def __init__(self, eng: sa.Engine) -> None:
        self.eng = eng

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("eroica_windows", "Windows by status (collecting, ready, claimed, done, failed)",
                              labels=["status"])
        try:
            with reading(self.eng) as c:
                for status, n in c.execute(sa.select(windows.c.status, sa.func.count()).group_by(windows.c.status)):
                    g.add_metric([status], n)
        except sa.exc.SQLAlchemyError:
            pass
        yield g


class _Loop(Collector):
    """The loop's numbers from the database at each scrape (the same on every replica): issues by
    state and category, and the last 7 days' medians to detect, localize and mitigate, and the
    accelerator-hours fixing gave back."""

    def __init__(self, eng: sa.Engine) -> None:
        self.eng = eng

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily("eroica_issues", "Issues (one per job, root cause and ranks) by state and category",
                                   labels=["state", "category"])
        stages = GaugeMetricFamily("eroica_week_median_seconds", "Median over the last 7 days' issues: fault onset "
                                   "to detection, window to diagnosis, diagnosis to recovery", labels=["stage"])
        hours = GaugeMetricFamily("eroica_week_accelerator_hours_recovered",
                                  "Accelerator-hours given back by issues opened in the last 7 days and fixed")
        try:
            with reading(self.eng) as c:
                for state, cat, n in c.execute(sa.select(issues.c.state, issues.c.category, sa.func.count())
                                               .group_by(issues.c.state, issues.c.category)):
                    states.add_metric([state, cat], n)
            now = time.time()
            week = week_summary(self.eng, now - 7 * 86400, now + 1)
            for stage in ("detect", "localize", "mitigate"):
                v = week[f"median_seconds_to_{stage}"]
                if v is not None:
                    stages.add_metric([stage], v)
            hours.add_metric([], week["accelerator_hours_recovered"])
        except sa.exc.SQLAlchemyError:
            pass
        yield from (states, stages, hours)


class _Hangs(Collector):
    """Each running job that is hung now (its stored verdict suspected or confirmed), as a series of its own:
    how long it has gone without a step. A job's series goes when the hang resolves or the job ends, so an
    alerting rule on it fires while the job is hung and resolves when it is not (deploy/prometheus/). The same
    on every replica: rules take the max over instances."""

    def __init__(self, eng: sa.Engine) -> None:
        self.eng = eng

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("eroica_job_stalled_seconds", "A hung job's seconds without a step (its hang verdict "
                              "suspected or confirmed; no series when it steps or ends)",
                              labels=["eroica_job", "state", "root_cause", "ranks"])
        t = hang_verdicts.c
        try:
            with reading(self.eng) as c:
                rows = c.execute(sa.select(t.job_id, t.state, t.body, t.at).join(jobs, jobs.c.id == t.job_id)
                                 .where(t.state.in_(("suspected", "confirmed")), jobs.c.ended_at.is_(None))
                                 .order_by(t.job_id).limit(10_000)).all()
        except sa.exc.SQLAlchemyError:
            rows = []
        now = time.time()
        for job_id, state, body, at in rows:
            body = body or {}
            ranks = ",".join(str(r) for r in sorted(body.get("ranks") or []))
            stalled = float(body.get("stalled_seconds") or 0.0) + max(0.0, now - float(at or now))
            g.add_metric([job_id, state, str(body.get("root_cause") or "unknown"), ranks], stalled)
        yield g


class ServiceMetrics:
    def __init__(self, eng: sa.Engine) -> None:
        self.registry = CollectorRegistry()
        # several HTTP processes (`serve --http-processes`): each counts in its own file of the
        # replica's directory, and a scrape, whichever process answers it, sums them all
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        r = None if shared else self.registry
        self.documents = Counter("eroica_documents_ingested", "Pattern documents stored", registry=r)
        self.errors = Counter("eroica_ingest_errors", "Documents or windows refused or failed", ["reason"],
                              registry=r)
        self.windows = Counter("eroica_windows_diagnosed", "Windows diagnosed", registry=r)
        self.findings = Counter("eroica_findings", "Findings at >= 0.5 by root cause", ["root_cause", "category"],
                                registry=r)
        self.ttd = Histogram("eroica_time_to_diagnosis_seconds",
                             "From the window's last document to its stored diagnosis", buckets=TTD_BUCKETS,
                             registry=r)
        self.hours = Counter("eroica_recovered_accelerator_hours", "Accelerator-hours given back by fixed findings "
                             "(slow minus current step time, times steps and accelerators, since recovery)",
                             registry=r)
        self.fixed = Counter("eroica_findings_recovered", "Issues closed as recovered by the job's own step series",
                             ["root_cause"], registry=r)
        self.hangs = Counter("eroica_hang_verdicts", "Hang verdicts stored, by stage (suspected, confirmed, "
                             "resolved) and root cause", ["state", "root_cause"], registry=r)
        if shared:
            MultiProcessCollector(self.registry, path=shared)
        self.registry.register(_Queue(eng))
        self.registry.register(_Loop(eng))
        self.registry.register(_Hangs(eng))

    def ingest_error(self, reason: str) -> None:
        self.errors.labels(reason=reason).inc()

    def diagnosed(self, w: dict[str, Any], d: Diagnosis, now: float) -> None:
        self.windows.inc()
        self.ttd.observe(max(0.0, now - float(w["last_doc_at"])))
        for wd in d.windows:
            for f in wd.findings:
                if f.confidence >= 0.5:
                    self.findings.labels(root_cause=f.root_cause, category=f.category.value).inc()

    def hang(self, f: HangFinding) -> None:
        self.hangs.labels(state=f.state, root_cause=f.root_cause).inc()

    def recovered(self, eng: sa.Engine, iid: int) -> None:
        with reading(eng) as c:
            i = c.execute(sa.select(issues.c.root_cause, issues.c.recovery).where(issues.c.id == iid)).one()
        self.fixed.labels(root_cause=i.root_cause).inc()
        self.hours.inc(float((i.recovery or {}).get("accelerator_hours", 0.0)))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
