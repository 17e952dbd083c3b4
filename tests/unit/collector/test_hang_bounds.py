"""The hang watchdog's costs are bounded: a dying process waits at most a few seconds for its
snapshot (a stalled file system cannot keep it, and its accelerators, alive); a job's own
faulthandler timer is left to it; the exception hook is put back at close; and a stalled rank of a
10,000-rank job reads its peers in a few store round trips, not 10,000."""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from polling import until

from eroica.collector.hang import EXCEPTION_SECONDS, HangWatch
from eroica.collector.hang_clock import HangClock
from eroica.collector.heartbeats import ADDRS_MAX, HB_KEY, PEERS_MAX, host_addresses, peer_sample, peers_view

ORIGINAL_LATER = faulthandler.dump_traceback_later


@pytest.fixture(autouse=True)
def _restore_excepthook():  # type: ignore[no-untyped-def]
    hook = sys.excepthook
    yield
    sys.excepthook = hook


def clock(floor_seconds: float) -> HangClock:
    """Suspected and confirmed at the same limit (10 x the median step, at least `floor_seconds`)."""
    return HangClock(floor_seconds, 10.0, 10.0, floor_seconds, 1.0)


def stepped(w: HangWatch, n: int = 5) -> None:
    for i in range(n):
        w.stepped(i + 1, 0.001)


def test_a_dying_process_waits_a_bounded_time_for_its_snapshot_on_a_stalled_file_system(tmp_path: Path) -> None:
    w = HangWatch(0, 1, tmp_path, None, clock=clock(300), poll_seconds=0.05)
    w.start()
    stepped(w)
    d = tmp_path / "hang-s000005"
    d.mkdir()
    os.mkfifo(d / ".rank-0.hang.json.tmp")            # opening it for writing blocks: a stalled mount
    done = threading.Event()

    def die() -> None:
        try:
            raise RuntimeError("Connection reset by peer")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
        done.set()
    t0 = time.monotonic()
    threading.Thread(target=die, daemon=True).start()
    assert done.wait(EXCEPTION_SECONDS + 5), "the exception hook never returned"
    assert time.monotonic() - t0 < EXCEPTION_SECONDS + 1
    w.close()
    with open(d / ".rank-0.hang.json.tmp", "rb", opener=lambda p, f: os.open(p, f | os.O_NONBLOCK)):
        pass                                           # let the blocked writer go


def test_the_exception_hook_is_put_back_at_close() -> None:
    before = sys.excepthook
    w = HangWatch(0, 1, None, None, clock=clock(300), poll_seconds=0.05)
    w.start()
    assert sys.excepthook is not before
    w.close()
    assert sys.excepthook is before


def test_a_jobs_own_faulthandler_timer_is_left_to_it(tmp_path: Path) -> None:
    w = HangWatch(0, 1, tmp_path, None, clock=clock(5), poll_seconds=0.05, native=True)
    w.start()
    stepped(w)
    until((tmp_path / "hang-native" / "rank-0.txt").exists, 10, "the watchdog's switch armed")
    mine = tmp_path / "mine.txt"
    name = "test_a_jobs_own_faulthandler_timer_is_left_to_it"
    with mine.open("w") as f:
        faulthandler.dump_traceback_later(0.6, repeat=False, file=f)     # the job's own
        time.sleep(0.3)                                # six watchdog polls: before, each re-armed its own
        stepped(w)
        until(lambda: name in mine.read_text(), 10, "the job's own timer fired")
    assert name in mine.read_text()
    w.close()
    assert faulthandler.dump_traceback_later is ORIGINAL_LATER        # the module as the job found it


class Counting:
    """The job's real TCPStore, counting the round trips made through it."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def call(*a: Any) -> Any:
            self.calls += 1
            return fn(*a)
        return call


def test_a_stalled_rank_of_a_10000_rank_job_reads_its_peers_in_a_few_round_trips() -> None:
    import torch.distributed as dist

    world = 10_000
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
    now = time.time()
    for r in peer_sample(4321, world):                 # every sampled peer has a heartbeat but one
        if r != 4322:
            store.set(HB_KEY.format(rank=r), json.dumps({"step": 30, "wall_time": now, "pid": 1, "host": "h"}))
    counted = Counting(store)
    peers = peers_view(counted, 4321, world)
    assert len(peers) == PEERS_MAX and peers["4322"] == {"heartbeat": None} and peers["0"]["step"] == 30
    assert {"4320", "4322", "0"} <= set(peers)          # its neighbours and rank 0
    assert counted.calls <= 2 * (PEERS_MAX // 16) + 16, counted.calls      # before: 2 per rank, 20,000
    small = peer_sample(1, 4)
    assert small == [0, 2, 3]
    w = HangWatch(3, world, None, None, clock=clock(300), poll_seconds=1.0)
    assert w._peers_every >= 19                       # and a big job's stalled ranks look less often


def test_a_heartbeat_carries_its_hosts_addresses_collective_interface_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's failed collective names an address ("Read error [10.0.0.4]"): each heartbeat says
    which addresses are its host's, so a stalled rank's view of the store ties the address to the
    ranks of that host. Read from this machine's interfaces (psutil), the collectives' first."""
    import psutil
    import torch.distributed as dist

    real = [n for n, addrs in psutil.net_if_addrs().items()
            if any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addrs)]
    if not real:
        pytest.skip("no interface with an IPv4 address besides loopback")
    last = sorted(real)[-1]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", last)
    mine = next(a.address for a in psutil.net_if_addrs()[last] if a.family == socket.AF_INET)
    got = host_addresses()
    assert got[0] == mine and len(got) <= ADDRS_MAX and not any(a.startswith("127.") for a in got)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
    w = HangWatch(1, 2, None, store, clock=clock(300), poll_seconds=1.0)
    w._heartbeat()
    assert peers_view(store, 0, 2)["1"]["addrs"] == got
