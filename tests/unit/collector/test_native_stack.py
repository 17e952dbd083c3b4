"""py-spy on a real process that holds the GIL in C code, as a peer's watchdog runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from eroica.collector.native_stack import silent_peers, write_dump
from eroica.schema.hang import native_frames


def test_silent_peers_are_living_processes_on_this_host_whose_heartbeat_stopped() -> None:
    peers = {"1": {"heartbeat_age_seconds": 30.0, "process_alive": True, "pid": 11},
             "2": {"heartbeat_age_seconds": 1.0, "process_alive": True, "pid": 12},      # heartbeats: runs Python
             "3": {"heartbeat_age_seconds": 30.0, "process_alive": None, "pid": 13},     # another host
             "4": {"heartbeat_age_seconds": 30.0, "process_alive": False, "pid": 14},    # gone
             "5": {"heartbeat": None}}
    assert silent_peers(peers, 10.0) == [(1, 11)]


def test_a_peer_reads_the_c_frames_of_a_process_holding_the_gil_once(tmp_path: Path) -> None:
    held = subprocess.Popen([sys.executable, "-c", "import ctypes; ctypes.PyDLL(None).sleep(60)"])
    try:
        time.sleep(0.5)
        assert write_dump(tmp_path, 1, held.pid, by_rank=2)
        assert not write_dump(tmp_path, 1, held.pid, by_rank=3)      # the first peer there wrote it
    finally:
        held.kill()
        held.wait()
    head, _, text = (tmp_path / "hang-native" / "rank-1.pyspy.txt").read_text().partition("\n")
    meta = json.loads(head)
    assert meta["gap"] is None and meta["by_rank"] == 2
    frames = native_frames(text, held.pid)
    assert frames[0].startswith(("clock_nanosleep", "nanosleep")) and any("ffi_call" in f for f in frames), frames


def test_a_process_py_spy_cannot_read_is_a_gap_not_a_silence(tmp_path: Path) -> None:
    assert write_dump(tmp_path, 2, 2**22 + 7, by_rank=0)          # no such process
    meta = json.loads((tmp_path / "hang-native" / "rank-2.pyspy.txt").read_text().splitlines()[0])
    assert meta["gap"] and "py-spy failed" in meta["gap"]
