"""The compiled rule base is cached between processes and any change to an input is a new key."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest

from eroica.engine import VERSION, rule_cache
from eroica.engine.pipeline import DiagnoseOptions, compile_knowledge
from eroica.engine.rules.layers import KnowledgeSpec
from eroica.engine.rules.source import builtin_knowledge_dir


def test_the_version_constant_is_the_installed_one() -> None:
    assert VERSION == metadata.version("eroica")


def test_a_cached_rule_base_is_used_until_a_rule_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EROICA_CACHE_DIR", str(tmp_path / "cache"))
    rules = tmp_path / "rules"
    shutil.copytree(builtin_knowledge_dir() / "rules", rules)
    opts = DiagnoseOptions(knowledge=KnowledgeSpec(site_dirs=(tmp_path,)))
    first = compile_knowledge(opts)
    assert len(list((tmp_path / "cache").glob("rules-*.pickle"))) == 1
    calls: list[int] = []
    real_put = rule_cache.put
    monkeypatch.setattr(rule_cache, "put", lambda *a: (calls.append(1), real_put(*a)))
    assert [r.id for r in compile_knowledge(opts)] == [r.id for r in first] and not calls    # from the cache
    f = next(rules.rglob("*.yaml"))
    f.write_text(f.read_text() + "\n# changed\n")
    compile_knowledge(opts)
    assert calls == [1]                                             # compiled again, cached under a new key


def test_a_broken_cache_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EROICA_CACHE_DIR", str(tmp_path))
    opts = DiagnoseOptions()
    n = len(compile_knowledge(opts))
    for p in tmp_path.glob("rules-*.pickle"):
        p.write_bytes(b"not a pickle")
    assert len(compile_knowledge(opts)) == n
    monkeypatch.setenv("EROICA_CACHE_DIR", "off")
    assert len(compile_knowledge(opts)) == n


def test_a_changed_hypotheses_file_is_a_new_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules are compiled against the hypotheses' fields: a site that adds one gets a fresh compile."""
    monkeypatch.setenv("EROICA_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    opts = DiagnoseOptions(knowledge=KnowledgeSpec(site_dirs=(site,)))
    compile_knowledge(opts)
    calls: list[int] = []
    real_put = rule_cache.put
    monkeypatch.setattr(rule_cache, "put", lambda *a: (calls.append(1), real_put(*a)))
    compile_knowledge(opts)
    assert not calls
    (site / "hypotheses.yaml").write_text("schema: eroica.hypotheses/v1\nhypotheses:\n  site_thing:\n"
                                          "    description: a site's own\n    evidence: x\n    fields: {}\n")
    compile_knowledge(opts)
    assert calls == [1]


def test_a_diagnosis_from_the_cache_imports_neither_the_compiler_nor_the_rule_schema(tmp_path: Path) -> None:
    """The point of the cache: a fresh process (each `eroica diagnose`) skips the compiler's, the rule
    schema's and the priors' imports as well as the compilation; a second process proves it."""
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom eroica.engine.pipeline import DiagnoseOptions, compile_knowledge\n"
            "n = len(compile_knowledge(DiagnoseOptions()))\n"
            "print(n, sorted(m for m in ('eroica.engine.rules.compiler', 'eroica.engine.rules.schema', "
            "'eroica.engine.priors') if m in sys.modules))\n")
    env = dict(os.environ, EROICA_CACHE_DIR=str(tmp_path))
    cold, warm = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
                  for _ in range(2))
    n, imported = cold.stdout.split(" ", 1)
    assert int(n) > 30 and "eroica.engine.rules.compiler" in imported      # compiled: it was needed
    assert warm.stdout.split(" ", 1) == [n, "[]\n"]
