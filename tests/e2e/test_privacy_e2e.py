"""At the strictest privacy level no user function name, source path or hostname leaves a rank,
and the diagnosis stays correct (a real 4-rank job with a blocking call in a user region)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose
from eroica.engine.reports import FORMATS, render
from eroica.lab.launch import launch

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def test_drop_level_hides_names_and_keeps_the_diagnosis(tmp_path: Path) -> None:
    res = launch(tmp_path, fault="user_code", fault_rank="3", fault_step=25, steps=100,
                 env={"EROICA_PRIVACY": "drop"}, progress=False)
    assert res.ok, res.returncodes
    d = diagnose(tmp_path)
    (w,) = d.windows
    top = w.findings[0]
    assert (top.root_cause, top.ranks) == ("user_code", [3]) and top.confidence >= 0.5
    assert (top.function or "").startswith("fn-") and w.coverage.privacy_levels == ["drop"]
    outputs = [p.read_text() for p in tmp_path.rglob("rank-*.json")] + [render(d, f) for f in FORMATS]
    host = socket.gethostname()
    for text in outputs:
        assert "log_metrics" not in text and "save_checkpoint" not in text     # user region names
        assert "workload.py" not in text and "/site-packages/" not in text      # source paths
        assert f'"hostname":"{host}"' not in text and f"@ {host}" not in text
    assert not list(tmp_path.rglob("*.trace.json"))
