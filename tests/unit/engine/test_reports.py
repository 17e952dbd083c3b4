"""Every recorded incident rendered to every format; the JSON validates against the committed
schema; the HTML is self-contained and small even for a 1,024-rank job; and, where Debian's
chromium is installed, a headless browser opens it without console errors or network requests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from patterns_factory import make_doc, write_run
from screenshot_support import keep_screenshot

from eroica.cli.schema_cmd import schema
from eroica.engine.evaluate import find_incidents, load_expected
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.reports import FORMATS, render

ROOT = Path(__file__).parents[3]
INCIDENTS = find_incidents(ROOT / "incidents")
SCHEMA = json.loads((ROOT / "docs" / "schema" / "eroica.diagnosis.v1.schema.json").read_text())
OPTS = DiagnoseOptions(in_process=True)
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


def test_the_committed_schemas_are_the_generated_ones() -> None:
    for kind in ("diagnosis", "patterns", "hang", "steps"):
        committed = json.loads((ROOT / "docs" / "schema" / f"eroica.{kind}.v1.schema.json").read_text())
        assert committed == schema(kind), f"regenerate: eroica schema {kind} > docs/schema/eroica.{kind}.v1.schema.json"


@pytest.mark.parametrize("inc", INCIDENTS, ids=[p.name for p in INCIDENTS])
def test_every_incident_renders_to_every_format(inc: Path) -> None:
    d = diagnose(inc / "patterns", OPTS)
    out = {fmt: render(d, fmt) for fmt in FORMATS}
    jsonschema.validate(json.loads(out["json"]), SCHEMA)
    exp = load_expected(inc / "expected.yaml")
    w = d.windows[0]
    html = out["html"]
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not EXTERNAL.search(html) and "<script" not in html
    assert len(html) < 1_000_000
    if exp.expect and exp.expect[0].min_confidence is None:       # a confident verdict comes first
        cause = exp.expect[0].root_cause
        if exp.top:
            assert f'<div class="cause">{cause}' in html
        assert all(f"<b>{e.root_cause}</b>" in html or f'"cause">{e.root_cause}' in html for e in exp.expect)
        assert f"`{cause}`" in out["md"] and cause in out["text"]
        assert "What it costs" in html or w.findings[0].cost is None
    elif not exp.expect:
        assert '<div class="cause">healthy</div>' in html and "ranks reported" in html
        assert ("Healthy" in out["md"] or "healthy" in out["text"])
    assert f"{len(w.coverage.ranks_reported)}/{w.coverage.world_size}" in html


def test_a_1024_rank_report_stays_under_a_megabyte(tmp_path: Path) -> None:
    docs = [make_doc(r, world=1024, step=0.16) for r in range(1024)]
    docs[700] = make_doc(700, world=1024, step=0.16, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                                           "data:DataLoader.__next__": 0.1})
    d = diagnose(write_run(tmp_path, docs), OPTS)
    html = render(d, "html")
    assert len(html) < 1_000_000, len(html)
    hm = d.windows[0].heatmap
    assert hm is not None and hm.rows[0].label == "rank 700" and hm.aggregated_ranks_total == 1024 - 32
    assert [r.label.split(": ")[-1] for r in hm.rows[-3:]] == ["p50", "p90", "max"]
    top = d.windows[0].findings[0]
    assert top.cost is not None and top.cost.ranks_waiting_total == 1024
    assert abs(top.cost.accelerator_hours_lost_per_hour - 1024 * top.cost.recovered_ratio) < 1.0


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_headless_chromium_shows_the_report_without_errors_or_network(tmp_path: Path) -> None:
    html = render(diagnose(ROOT / "incidents" / "INC-0017" / "patterns", OPTS), "html")
    page = tmp_path / "report.html"
    page.write_text(html)
    shot, netlog = tmp_path / "report.png", tmp_path / "net.json"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           f"--log-net-log={netlog}", "--window-size=1280,2000", f"--screenshot={shot}", page.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000, res.stderr[-2000:]
    console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    events = json.loads(netlog.read_text())["events"]
    # requests the page made (the browser's own background requests carry another network key)
    page_requests = {e["params"]["url"] for e in events if "url" in e.get("params", {})
                     and "file://" in str(e["params"].get("network_isolation_key", ""))
                     and not e["params"]["url"].startswith("file:")}
    assert page_requests == set(), page_requests
    keep_screenshot(shot, "report.png")


def test_a_kept_raw_trace_is_linked_for_perfetto(tmp_path: Path) -> None:
    docs = [make_doc(r, step=0.16) for r in range(4)]
    docs[2] = make_doc(2, step=0.16, busy={"compute:forward": 0.02, "data:DataLoader.__next__": 0.1})
    run = write_run(tmp_path, docs)
    trace = run / "w000-s30" / "rank-2.trace.json"
    trace.write_text('{"traceEvents": []}')
    d = diagnose(run, OPTS)
    assert d.windows[0].raw_traces == {"2": str(trace.resolve())}
    html = render(d, "html")
    assert f'href="file://{trace.resolve()}"' in html and "Perfetto" in html


def test_a_fix_brings_the_step_back_to_what_it_was_before_never_below() -> None:
    """The demo's loader stall: the step went 56 -> 162 ms and the culprit's excess over peers that
    themselves waited reads 121 ms; fixed, the step goes back to 56 ms, not to 41 ms."""
    from eroica.engine.report_data import cost
    from eroica.schema.diagnosis import ConfidenceFactors, Finding, FindingCategory

    f = Finding(root_cause="dataloader_stall", category=FindingCategory("software"), component="c", ranks=[1],
                hosts=["h"], function="f", confidence=0.9, summary="s", evidence=[], rule_ids=["r"],
                excess_seconds_per_step=0.121, confidence_factors=ConfidenceFactors(
                    rule_ratio=0.9, deviation_strength_ratio=1, step_consistency_ratio=1, peer_group_ratio=1,
                    coverage_ratio=1, peer_group="g", peer_group_valid=True))
    c = cost(f, 0.162, 4, before_seconds=0.056)
    assert c is not None and (c.excess_seconds_per_step, c.step_seconds_if_fixed) == (0.106, 0.056)
    assert c.accelerator_hours_lost_per_hour == round(4 * 0.106 / 0.162, 3)
    for before in (None, 0.2):        # no earlier step, or the job was no faster before: the excess as measured
        c = cost(f, 0.162, 4, before_seconds=before)
        assert c is not None and c.excess_seconds_per_step == 0.121
