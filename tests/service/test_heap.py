"""The service processes' collection policy (eroica.engine.heap) and the diagnosis worker's warm-up:
a worker's first window pays no import the warm-up could have paid."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from eroica.engine.heap import held_off


def test_collection_is_held_off_inside_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with held_off():
        assert not gc.isenabled()
        with held_off():                    # nested: still off, and the outer one restores it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), held_off():
        raise RuntimeError("a diagnosis failed")
    assert gc.isenabled()


def test_a_warm_worker_has_imported_what_reading_a_stored_window_needs() -> None:
    """In a fresh interpreter: the store's module does not import the migration tool (a worker never
    migrates), and after `warm` a window's diagnosis imports none of the store, the driver or the rule
    runtime."""
    code = """
import json, sys
import eroica.service.db
no_alembic = "alembic" not in sys.modules
from eroica.service.worker import warm
warm([])
before = set(sys.modules)
import eroica.service.docs, eroica.engine.rules._durable, psycopg, sqlalchemy.dialects.postgresql.psycopg
import gc
frozen = gc.get_freeze_count() > 0
print(json.dumps({"no_alembic": no_alembic, "new": sorted(set(sys.modules) - before), "gc_frozen": frozen}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out == {"no_alembic": True, "new": [], "gc_frozen": True}
