"""Compiled report templates are kept between processes, recompiled when their source changes,
and never in the way: a cache that cannot be written leaves the report as it was."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

import eroica.engine.reports as render


def _env(cache: Path, source: str) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.DictLoader({"r.j2": source}),
                              bytecode_cache=render._CompiledTemplates(str(cache)))


def test_a_compiled_template_is_reused_and_a_changed_source_is_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "made" / "here"
    assert _env(cache, "one {{ x }}").get_template("r.j2").render(x=1) == "one 1"
    entries = list(cache.iterdir())
    assert len(entries) == 1
    before = entries[0].read_bytes()
    assert _env(cache, "one {{ x }}").get_template("r.j2").render(x=2) == "one 2"     # read back
    assert _env(cache, "two {{ x }}").get_template("r.j2").render(x=3) == "two 3"     # not the stale one
    assert entries[0].read_bytes() != before


def test_a_cache_that_cannot_be_written_or_read_is_not_used(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _env(blocker / "below", "ok {{ x }}").get_template("r.j2").render(x=1) == "ok 1"
    garbled = tmp_path / "garbled"
    _env(garbled, "ok {{ x }}").get_template("r.j2")
    for f in garbled.iterdir():
        f.write_bytes(b"j2 not bytecode")
    assert _env(garbled, "ok {{ x }}").get_template("r.j2").render(x=2) == "ok 2"


@pytest.mark.parametrize("setting", ["dir", "off"])
def test_the_report_templates_use_eroicas_cache_dir_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            setting: str) -> None:
    monkeypatch.setenv("EROICA_CACHE_DIR", str(tmp_path) if setting == "dir" else "off")
    render._env.cache_clear()
    try:
        render.template("text")
        render.template("html")
        kept = sorted(p.parent.name for p in tmp_path.glob("templates/*/*"))
        assert kept == (["escaped", "plain"] if setting == "dir" else [])
    finally:
        render._env.cache_clear()
