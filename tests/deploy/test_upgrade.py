"""Upgrades across replicas (docs/deploy.md, "Upgrades"): `eroica serve --migrate` brings a database to this
version's schema and exits, replicas started together take turns on PostgreSQL's advisory lock, and every
migration only adds (tables, columns, indexes; a NOT NULL relaxed), so replicas of the previous version keep
working against the upgraded schema while the new ones roll out."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from service_support import PG, PG_WHY, postgres

ROOT = Path(__file__).parents[2]
VERSIONS = ROOT / "service" / "migrations" / "versions"
EROICA = str(Path(sys.executable).parent / "eroica")
HEAD, PREVIOUS = (f.name[:4] for f in sorted(VERSIONS.glob("0*.py"))[::-1][:2])
DESTRUCTIVE = {"drop_column", "drop_table", "rename_table", "drop_constraint"}


def test_every_migration_only_adds_what_the_previous_version_can_ignore() -> None:
    files = sorted(VERSIONS.glob("*.py"))
    assert len(files) >= 14
    for f in files:
        up = next(n for n in ast.parse(f.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "upgrade")
        for call in (n for n in ast.walk(up) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            name = call.func.attr
            assert name not in DESTRUCTIVE, f"{f.name}: upgrade() calls {name}: the previous version's replicas " \
                                            "would break mid-upgrade (add, copy, and drop in a later release)"
            if name == "alter_column":
                kw = {k.arg: k.value for k in call.keywords}
                assert set(kw) <= {"existing_type", "nullable"} and isinstance(kw.get("nullable"), ast.Constant) \
                    and kw["nullable"].value is True, f"{f.name}: alter_column may only relax NOT NULL"


def migrate(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EROICA, "serve", "--db", url, "--migrate"], capture_output=True, text=True, timeout=120)


def test_migrate_brings_an_older_schema_to_this_versions_and_exits(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    from eroica.service.db import MIGRATIONS, make_engine

    url = f"sqlite:///{tmp_path / 'old.db'}"
    eng = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with eng.begin() as conn:                     # the database as the previous release left it
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, PREVIOUS)
    eng.dispose()
    p = migrate(url)
    assert p.returncode == 0 and f"schema {PREVIOUS} -> {HEAD}" in p.stdout, p.stdout + p.stderr
    p = migrate(url)
    assert p.returncode == 0 and "(already current)" in p.stdout
    bad = migrate("postgresql://nobody@127.0.0.1:1/x")
    assert bad.returncode == 1 and "connection" in bad.stderr.lower() and "Traceback" not in bad.stderr


@pytest.mark.skipif(not PG, reason=PG_WHY)
def test_replicas_migrating_together_on_postgresql_take_turns() -> None:
    with postgres() as url:
        procs = [subprocess.Popen([EROICA, "serve", "--db", url, "--migrate"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        said = sorted(o.split("schema ", 1)[1].strip() for o, _ in outs)
        assert sum(s == f"empty -> {HEAD}" for s in said) == 1, said      # one upgraded, the others found it done
        assert said.count(f"{HEAD} -> {HEAD} (already current)") == 2, said
