"""Render a Diagnosis as text, Markdown or JSON (jinja2 templates shipped in the package)."""

from __future__ import annotations

import json
from importlib import resources

import jinja2

from eroica.engine.diagnosis import Diagnosis

FORMATS = ("text", "json", "md")


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: (resources.files("eroica.engine") / "templates" / name).read_text()
        ),
        autoescape=False,
        trim_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["ms"] = _ms
    return env


def render(d: Diagnosis, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(d.model_dump(mode="json", by_alias=True), indent=2) + "\n"
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    name = {"text": "report.txt.j2", "md": "report.md.j2"}[fmt]
    return _env().get_template(name).render(d=d)
