"""Render a Diagnosis as text, Markdown, HTML or JSON (jinja2 templates shipped in the package)."""

from __future__ import annotations

import contextlib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2

from eroica.engine import FORMATS
from eroica.engine.hang import render as render_hang
from eroica.engine.render_html import window_pictures
from eroica.engine.rule_cache import cache_dir
from eroica.engine.rules.source import builtin_knowledge_dir
from eroica.schema.diagnosis import ConfidenceFactors, Diagnosis, Finding, WindowDiagnosis


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


def _gap_sources(gaps: list[str]) -> str:
    """'rank 3: nvml: reason' lines -> 'nvml (4 ranks)'."""
    by: dict[str, set[str]] = {}
    for g in gaps:
        parts = g.split(": ", 2)
        if len(parts) >= 2:
            by.setdefault(parts[1], set()).add(parts[0])
    return ", ".join(f"{src} ({len(r)} rank{'s' if len(r) > 1 else ''})" for src, r in sorted(by.items()))


def _factor_notes(cf: ConfidenceFactors) -> dict[str, str]:
    """What a factor's number alone does not say, by its label (eroica.schema.diagnosis.FACTORS)."""
    notes = {"peers": cf.peer_group + ("" if cf.peer_group_valid else ", not a valid group"),
             "across windows": f"seen in {cf.windows_seen_total} of the {cf.windows_total} windows since first seen",
             "explained away": f"by {cf.explained_away_by}", "contested": f"by {cf.contested_by}",
             "evidence missing": ", ".join(cf.evidence_missing),
             "standing": f"the job's first such pause at step {cf.standing_step}"}
    return {label: notes[label] for label, _ in cf.terms() if notes.get(label)}


def _surer_present(f: Finding) -> bool:
    """Is the finding surer of its cause's presence than of its cost (its cost lowered its confidence)?"""
    return f.presence_confidence is not None and f.presence_confidence - f.confidence >= 0.01


def _present_at_no_cost(w: WindowDiagnosis) -> list[Finding]:
    """A window's findings present at 0.5 or more (what a healthy window still has, at little or no cost)."""
    return [f for f in w.findings if (f.presence_confidence or 0.0) >= 0.5]


def _runbook(runbook: str) -> tuple[str, str | None]:
    """(what to show, where it links): a URL as itself; a knowledge path to its file, when it exists."""
    if "://" in runbook:
        return runbook, runbook
    path = Path(runbook) if runbook.startswith("/") else builtin_knowledge_dir() / runbook
    return (runbook if runbook.startswith("/") else f"knowledge/{runbook}"), (path.as_uri() if path.is_file() else None)


TEMPLATES = {"text": "report.txt.j2", "md": "report.md.j2", "html": "report.html.j2"}


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept between processes (compiling a report's template is a visible share of
    a small `eroica diagnose`, loading it is not: bench/traces.py). Jinja recompiles when a template's
    source changes (each entry holds its source's checksum, and Jinja's and Python's bytecode
    versions). A cache that cannot be read or written is not used; the report is rendered all the
    same."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().load_bytecode(bucket)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)


def _compiled(autoescape: bool) -> jinja2.BytecodeCache | None:
    d = cache_dir()
    # an escaping environment compiles the same source differently: its own directory
    return None if d is None else _CompiledTemplates(str(d / "templates" / ("escaped" if autoescape else "plain")))


@lru_cache(maxsize=None)
def _env(autoescape: bool = False) -> jinja2.Environment:
    env = jinja2.Environment(
        bytecode_cache=_compiled(autoescape),
        loader=jinja2.FunctionLoader(
            lambda name: (resources.files("eroica.engine") / "templates" / name).read_text()
        ),
        autoescape=autoescape,
        trim_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["ms"] = _ms
    env.globals["gap_sources"] = _gap_sources
    env.globals["factor_notes"] = _factor_notes
    env.globals["surer_present"] = _surer_present
    env.globals["present_at_no_cost"] = _present_at_no_cost
    env.globals["runbook"] = _runbook
    env.globals["hang_text"] = render_hang
    return env


def template(fmt: str) -> jinja2.Template:
    """A format's compiled template, once per process (`eroica diagnose` compiles it while its
    ingestion workers run)."""
    if fmt not in TEMPLATES:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return _env(autoescape=fmt == "html").get_template(TEMPLATES[fmt])


def render(d: Diagnosis, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(d.model_dump(mode="json", by_alias=True), indent=2) + "\n"
    if fmt == "html":
        title = ", ".join([f"{d.hang.root_cause} on rank {','.join(map(str, d.hang.ranks))}"] if d.hang else []
                          + [f"{f.root_cause} on rank {','.join(map(str, f.ranks))}" for w in d.windows
                             for f in w.findings[:1] if f.confidence >= 0.5]) or "healthy"
        return template("html").render(d=d, pictures=window_pictures, title=title)
    return template(fmt).render(d=d)
