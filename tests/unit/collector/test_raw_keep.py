"""The raw-trace election on a real torch TCPStore: four ranks, each with its own client and thread."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from eroica.collector.raw_keep import RawTraceKeeper, choose

torch_dist = pytest.importorskip("torch.distributed")


def test_the_suspects_and_the_rank_nearest_the_median_are_kept() -> None:
    assert choose({0: 0.020, 1: 0.021, 2: 0.019, 3: 0.080}, 3) == [0, 3]   # rank 0 ties rank 1: the lower
    # two suspects and the healthy peer, bounded
    kept = choose({r: 0.02 + 0.0001 * r for r in range(16)} | {4: 0.09, 9: 0.07}, 3)
    assert 4 in kept and 9 in kept and len(kept) == 3
    assert len(choose({r: 0.02 + 0.0001 * r for r in range(16)} | {4: 0.09, 9: 0.07, 11: 0.08}, 3)) == 3
    # nobody stands out: the busiest and the median one
    assert len(choose({0: 0.02, 1: 0.02, 2: 0.02, 3: 0.02}, 3)) == 2
    assert choose({}, 3) == [] and choose({0: 1.0}, 3) == [0]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _elect(tmp_path: Path, scores: dict[int, float], world: int, wait: float) -> tuple[dict[int, bool], list[str]]:
    from datetime import timedelta

    port = _port()
    master = torch_dist.TCPStore("127.0.0.1", port, world, True, timedelta(seconds=10), wait_for_workers=False)
    problems: list[str] = []
    keepers = []
    for rank, score in scores.items():
        store = master if rank == 0 else torch_dist.TCPStore("127.0.0.1", port, world, False, timedelta(seconds=10))
        k = RawTraceKeeper(store, rank, world, 3, wait, problems.append)
        spool = RawTraceKeeper.spool(tmp_path, "w000-s30", rank)
        spool.write_text('{"traceEvents": []}')
        keepers.append(k)
        threading.Thread(target=k.offer, args=("w000-s30", score, spool, tmp_path / "w000-s30" /
                                               f"rank-{rank}.trace.json")).start()
    for k in keepers:
        while k._thread is None:            # noqa: SLF001 - offered from another thread
            pass
        k.join(wait + 5)
    return {k.rank: k.decided.get("w000-s30", False) for k in keepers}, problems


def test_four_ranks_keep_the_stragglers_trace_and_one_healthy_peers(tmp_path: Path) -> None:
    kept, problems = _elect(tmp_path, {0: 0.020, 1: 0.075, 2: 0.021, 3: 0.019}, 4, 10.0)
    assert not problems
    assert kept[1] and sum(kept.values()) == 2, kept
    on_disk = sorted(p.name for p in (tmp_path / "w000-s30").glob("rank-*.trace.json"))
    assert on_disk == [f"rank-{r}.trace.json" for r in sorted(r for r, k in kept.items() if k)]
    assert not (tmp_path / "w000-s30" / ".raw").exists()          # the spool is gone


def test_a_rank_that_never_reports_leaves_no_decision_and_every_trace_is_dropped_and_said(tmp_path: Path) -> None:
    kept, problems = _elect(tmp_path, {0: 0.020, 1: 0.075, 2: 0.021}, 4, 1.0)
    assert not any(kept.values()) and len(problems) == 3 and "no keep decision" in problems[0]
    assert not list((tmp_path / "w000-s30").glob("rank-*.trace.json"))
