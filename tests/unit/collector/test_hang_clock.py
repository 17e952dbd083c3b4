"""When a stall is a suspected hang and when a confirmed one, from the job's own history; and the
suspicion that comes early when the peers stand at another collective than the stalled rank (a
real TCPStore, real heartbeats)."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import pytest
from polling import until

from eroica.collector.hang import HangWatch
from eroica.collector.hang_clock import HangClock, hang_clock
from eroica.collector.heartbeats import HB_KEY
from eroica.collector.policy import TriggerPolicy
from eroica.engine.hang import pause_factor


@pytest.fixture(autouse=True)
def _restore_excepthook():  # type: ignore[no-untyped-def]
    hook = sys.excepthook
    yield
    sys.excepthook = hook


def test_the_default_policy_suspects_after_20_s_and_confirms_at_300_s_or_after_the_jobs_longest_pause() -> None:
    c = hang_clock(TriggerPolicy())
    assert c.state(100.0) is None                         # not judged before three measured steps
    for step in range(1, 40):
        c.add(step, 0.2)
    assert (c.suspect_after(), c.early_after(), c.confirm_after()) == (20.0, 5.0, 300.0)
    assert [c.state(s) for s in (19.0, 21.0, 299.0, 301.0)] == [None, "suspected", "suspected", "confirmed"]
    c.add(40, 250.0)                                      # a 250 s checkpoint: a pause the job makes
    assert c.confirm_after() == 375.0 and c.state(301.0) == "suspected"
    assert (c.longest_pause_seconds, c.longest_pause_step) == (250.0, 40)
    slow = hang_clock(TriggerPolicy())
    for step in range(1, 10):
        slow.add(step, 8.0)                               # 8 s steps: 5x the median, not 20 s
    assert (slow.suspect_after(), slow.confirm_after()) == (40.0, 300.0)


def test_a_suspicion_weighs_the_stall_against_the_jobs_longest_healthy_pause() -> None:
    assert pause_factor("suspected", 30.0, 2.0) == 1.0     # 15x the longest pause: a finding at a 0.9 prior
    assert pause_factor("suspected", 30.0, 60.0) == 0.3    # shorter than a checkpoint the job makes: low
    assert pause_factor("suspected", 90.0, 60.0) == 0.5    # half-way between the pause and twice it
    assert pause_factor("suspected", 130.0, 60.0) == 1.0
    assert pause_factor("confirmed", 30.0, 60.0) == 1.0
    assert 0.9 * pause_factor("suspected", 30.0, 2.0) >= 0.5 > 0.9 * pause_factor("suspected", 30.0, 60.0)


class Store:
    """A TCPStore with the peers' heartbeats as their watchdogs write them."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))

    def beat(self, rank: int, step: int, seq: int) -> None:
        self.s.set(HB_KEY.format(rank=rank), json.dumps({"step": step, "wall_time": time.time(), "pid": 1,
                                                         "host": "elsewhere", "seq": seq}))


@pytest.mark.parametrize(("peer_seq", "early"), [(97, True), (96, False)])
def test_the_peers_at_another_collective_make_a_stall_a_suspicion_early(tmp_path: Path, peer_seq: int,
                                                                         early: bool) -> None:
    """Suspected after 2 s (a quarter of 8 s) when the peers stand at collective #97 and this rank at
    #96; at the same collective it waits for the 8 s of a plain stall."""
    store = Store()
    clock = HangClock(8.0, 5.0, 20.0, 60.0, 1.5)
    w = HangWatch(0, 3, tmp_path, store.s, clock=clock, poll_seconds=0.1)
    w.collectives.seq = lambda: 96  # type: ignore[method-assign]   # no process group here: the number it would read
    w.start()
    try:
        for step in range(1, 6):
            w.stepped(step, 0.01)
        t0 = time.monotonic()
        for r in (1, 2):
            store.beat(r, 5, peer_seq)

        def written() -> list[Path]:
            for r in (1, 2):
                store.beat(r, 5, peer_seq)
            return list(tmp_path.glob("hang-s*/rank-0.hang.json"))
        until(written, 12, "no snapshot")
        took = time.monotonic() - t0
        snap = json.loads(next(tmp_path.glob("hang-s*/rank-0.hang.json")).read_text())
    finally:
        w.close()
    assert snap["state"] in ("suspected", "resolved")
    if early:
        assert took < 6, took
        assert "#96" in snap["suspected_because"] and "#97" in snap["suspected_because"], snap["suspected_because"]
    else:
        assert took >= 8, took
        assert snap["suspected_because"].startswith("no step for")
    assert snap["peers"]["1"]["seq"] == peer_seq


def test_a_confirmation_keeps_why_the_stall_was_first_suspected(tmp_path: Path) -> None:
    w = HangWatch(0, 1, tmp_path, None, clock=HangClock(0.3, 5.0, 20.0, 1.0, 1.5), poll_seconds=0.05)
    w.start()
    try:
        for step in range(1, 6):
            w.stepped(step, 0.001)

        def confirmed() -> dict | None:  # type: ignore[type-arg]
            f = tmp_path / "hang-s000005" / "rank-0.hang.json"
            snap = json.loads(f.read_text()) if f.exists() else None
            return snap if snap and snap["state"] == "confirmed" else None
        snap = until(confirmed, 10, "a confirmed snapshot")
    finally:
        w.close()
    assert snap["stalled_seconds"] > 1.0 and "(suspected after 0.3 s)" in snap["suspected_because"], snap
