"""A cause on every rank of one host is the host's problem, named once; on some of its ranks, theirs.
(Simulated GPU fleet: 4 hosts of 8 ranks, `eroica simulate`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose
from eroica.lab.simulate import simulate


@pytest.mark.parametrize("culprits, scope", [(list(range(8, 16)), "host"), ([9, 12], "rank")])
def test_a_cause_on_every_rank_of_a_host_is_one_host_finding(tmp_path: Path, culprits: list[int], scope: str) -> None:
    simulate(tmp_path, 32, "gpu_throttled", seed=3, culprits=culprits, workers=1)
    (w,) = diagnose(tmp_path).windows
    mine = [f for f in w.findings if f.root_cause == "gpu_throttled"]
    if scope == "host":
        (f,) = mine
        assert (f.scope, f.ranks, len(f.hosts)) == ("host", culprits, 1)
        assert f.summary.startswith(f"host {f.hosts[0]}:")
    else:
        assert sorted(r for f in mine for r in f.ranks) == culprits
        assert {f.scope for f in mine} == {"rank"}
