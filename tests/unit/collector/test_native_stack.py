"""py-spy on a real process that holds the GIL in C code, as a peer's watchdog runs it."""

from __future__ import annotations

import subprocess
import sys
import time

from eroica.collector.native_stack import claim, silent_peers, snapshot_for
from eroica.schema.hang import HangSnapshot

HOLD = "import ctypes\ndef stuck():\n    ctypes.PyDLL(None).sleep(60)\nstuck()\n"


def test_silent_peers_are_living_processes_on_this_host_whose_heartbeat_stopped() -> None:
    peers = {"1": {"heartbeat_age_seconds": 30.0, "process_alive": True, "pid": 11},
             "2": {"heartbeat_age_seconds": 1.0, "process_alive": True, "pid": 12},      # heartbeats: runs Python
             "3": {"heartbeat_age_seconds": 30.0, "process_alive": None, "pid": 13},     # another host
             "4": {"heartbeat_age_seconds": 30.0, "process_alive": False, "pid": 14},    # gone
             "5": {"heartbeat": None}}
    assert [r for r, _ in silent_peers(peers, 10.0)] == [1]


def test_a_peer_reads_the_python_and_c_frames_of_a_process_holding_the_gil(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "stuck.py"
    script.write_text(HOLD)
    held = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.6)
        view = {"pid": held.pid, "host": "h", "step": 30, "heartbeat_age_seconds": 12.0, "process_alive": True}
        snap = snapshot_for(1, view, by_rank=2, world_size=4, job="j", limit_seconds=4.0)
    finally:
        held.kill()
        held.wait()
    doc = HangSnapshot.model_validate(snap)            # what the service accepts
    assert doc.native and doc.read_by_rank == 2 and doc.owns_gil is True and doc.native_gap is None
    assert doc.native_frames[0].startswith(("clock_nanosleep", "nanosleep")), doc.native_frames
    assert any("ffi_call" in f for f in doc.native_frames)
    assert [(f.function, f.line) for f in doc.stack][:1] == [("stuck", 3)] and "PyDLL" in doc.stack[0].code
    assert doc.last_step == 30 and doc.stalled_seconds == 12.0


def test_a_process_py_spy_cannot_read_is_a_gap_not_a_silence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    view = {"pid": 2**22 + 7, "step": 3, "heartbeat_age_seconds": 9.0, "process_alive": True}
    snap = snapshot_for(2, view, by_rank=0, world_size=4, job="j", limit_seconds=4.0)
    assert snap["native_gap"] and "py-spy failed" in snap["native_gap"] and snap["stack"] == []
    assert HangSnapshot.model_validate(snap).native_gap == snap["native_gap"]


def test_the_first_peer_claims_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert claim(tmp_path, 1) is not None and claim(tmp_path, 1) is None and claim(None, 1) is None
