"""The host's one sampler helper: real helper processes, real Unix sockets, real /proc readings."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from host_helper_support import helper_pids, wait_gone
from polling import until

from eroica.collector import host_sampler
from eroica.collector.host_sampler import HostSamplerClient, socket_path
from eroica.collector.proc_sources import SchedStat
from eroica.collector.sampler import HardwareSampler, Ticker
from eroica.collector.summarize import hardware_summary

RANK = textwrap.dedent("""
    import os, sys, threading, time
    from eroica.collector.host_sampler import HostSamplerClient
    c = HostSamplerClient(os.getpid(), threading.get_native_id())
    assert c.start(0.01, 1000)
    print("started", c.scope, c.helper_pid, flush=True)
    sys.stdin.readline()                       # the test says when to stop
    t = time.monotonic()
    while time.monotonic() - t < 0.5:          # spin: this rank is on CPU, the test's rank sleeps
        pass
    s = c.stop()
    ok = s is not None and len(s.t_ns) > 5
    print("stopped", ok, flush=True)
    c.close()
""")


@pytest.fixture
def own_tmp(monkeypatch):  # type: ignore[no-untyped-def]
    """A TMPDIR of this test's own (short: a Unix socket's path has ~100 bytes), so its helper is its own."""
    d = tempfile.mkdtemp(prefix="eh", dir="/tmp")
    monkeypatch.setenv("TMPDIR", d)
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def samples_on_its_own() -> None:
    """This rank, refused the host helper, samples with a helper of its own, and nothing is lost."""
    c = HostSamplerClient(os.getpid(), threading.get_native_id())
    try:
        assert c.scope == "rank" and c.gaps == []
        assert c.start(0.01, 100)
        time.sleep(0.1)                                # a window of 0.1 s (the helper samples it)
        series = c.stop()
        assert series is not None and len(series.t_ns) > 3
    finally:
        c.close()


def test_two_ranks_share_one_helper_and_each_gets_its_own_process_sampled(own_tmp) -> None:  # type: ignore[no-untyped-def]
    other = subprocess.Popen([sys.executable, "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdin is not None
    first = other.stdout.readline().split()
    assert first[:2] == ["started", "host"], first
    mine = HostSamplerClient(os.getpid(), threading.get_native_id())
    try:
        assert mine.scope == "host" and mine.helper_pid == int(first[2])     # one helper for both ranks
        assert helper_pids(socket_path()) == [mine.helper_pid]
        assert mine.start(0.01, 1000)
        other.stdin.write("go\n")
        other.stdin.flush()
        time.sleep(0.5)                                                       # this rank sleeps
        series = mine.stop()
        assert other.stdout.readline().split() == ["stopped", "True"]
    finally:
        mine.close()
        other.stdin.close()
        other.wait(timeout=10)
        other.stdout.close()
    assert series is not None and len(series.t_ns) > 20 and np.all(np.diff(series.t_ns) > 0)
    hw = hardware_summary(series, 0.5)
    assert hw.cpu_util_ratio is not None and hw.cpu_util_ratio < 0.3          # its own thread, asleep
    assert series.sampler_cpu_seconds > 0
    # the last rank gone, the helper leaves after its linger, and takes its socket with it
    assert wait_gone(socket_path(), host_sampler.LINGER_SECONDS + 5)
    assert not socket_path().exists()


def test_a_helper_killed_mid_window_is_a_gap_and_the_rank_samples_on_its_own_after(own_tmp) -> None:  # type: ignore[no-untyped-def]
    c = HostSamplerClient(os.getpid(), threading.get_native_id(), timeout_seconds=2.0)
    try:
        assert c.scope == "host" and c.start(0.01, 1000)
        os.kill(c.helper_pid, 9)
        assert c.stop() is None
        assert any("host sampler stop failed" in g.reason for g in c.gaps)
        assert c.scope == "rank"
        assert c.start(0.01, 1000)                                            # the next window is sampled
        time.sleep(0.2)                                                   # a window of 0.2 s
        series = c.stop()
        assert series is not None and len(series.t_ns) > 5
    finally:
        c.close()


def test_a_socket_directory_others_can_enter_is_not_used(own_tmp) -> None:  # type: ignore[no-untyped-def]
    d = socket_path().parent
    d.mkdir(mode=0o700)
    d.chmod(0o777)
    samples_on_its_own()
    assert not socket_path().exists()


def test_a_stale_socket_is_replaced_and_a_claimed_thread_of_another_process_is_refused(own_tmp) -> None:  # type: ignore[no-untyped-def]
    path = socket_path()
    path.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()                                      # a socket file nobody listens on (a helper killed)
    c = HostSamplerClient(os.getpid(), threading.get_native_id())
    try:
        assert c.scope == "host"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(b"attach 1 -1\n")                     # thread 1 is not this process's: no sampling
        assert s.recv(64) == b""
        s.close()
    finally:
        c.close()


def test_one_ticker_drives_several_samplers_and_splits_its_cpu() -> None:
    tid = threading.get_native_id()
    t = Ticker(0.002)
    a = HardwareSampler([SchedStat(os.getpid(), tid)], 0.002, 500, ticker=t)
    b = HardwareSampler([SchedStat(os.getpid(), tid)], 0.002, 500, ticker=t)
    a.start()
    b.start()
    until(lambda: a.ticks > 20, 10, "20 ticks of a")
    sa = a.stop()
    alone = b.ticks
    until(lambda: b.ticks > alone + 10, 10, "10 ticks of b alone")   # b alone on the ticker now
    sb = b.stop()
    assert t.close()
    assert len(sa.t_ns) > 10 and len(sb.t_ns) > len(sa.t_ns)
    assert np.isfinite(sb.columns["main_cpu_ns"]).all()
    # the same wake-ups: each of a's samples but its last (taken at its stop) has one of b's right after it,
    # from b's first tick on (the ticker's thread starts with a alone, so it can tick a once before b joins)
    tb = sb.t_ns
    ta = sa.t_ns[:-1]
    ta = ta[ta > tb[0] - 500_000]
    assert len(ta) > 10
    nearest = tb[np.minimum(np.searchsorted(tb, ta), len(tb) - 1)]
    assert np.all((nearest >= ta) & (nearest - ta < 500_000))
    assert sa.sampler_cpu_seconds > 0 and sb.sampler_cpu_seconds > sa.sampler_cpu_seconds / 2


THROTTLED_RANK = textwrap.dedent("""
    import os, sys, threading
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as fh:   # a throttled container
        fh.write(str(os.getpid()))
    from eroica.collector.host_sampler import HostSamplerClient
    c = HostSamplerClient(os.getpid(), threading.get_native_id())
    print(c.scope, c.helper_pid, flush=True)
    sys.stdin.readline()
    c.close()
""")


def test_a_helper_in_another_cgroup_with_a_cpu_quota_is_not_shared(own_tmp) -> None:  # type: ignore[no-untyped-def]
    """A rank in a throttled container spawned the host helper: the helper shares its quota, so a rank
    elsewhere samples on its own rather than be starved with it."""
    from eroica.lab.launch import CPU_ROOT, KilledCgroup

    if not (CPU_ROOT / "cgroup.procs").exists() or not os.access(CPU_ROOT, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu (root)")
    cg = CPU_ROOT / f"eroica-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "cpu.cfs_period_us").write_text("100000")
        (cg / "cpu.cfs_quota_us").write_text("50000")
        other = subprocess.Popen([sys.executable, "-c", THROTTLED_RANK, str(cg)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert other.stdout is not None and other.stdin is not None
        scope, helper = other.stdout.readline().split()
        assert scope == "host" and str(int(helper)) in (cg / "cgroup.procs").read_text().split()
        try:
            samples_on_its_own()
        finally:
            other.stdin.close()
            other.wait(timeout=10)
            other.stdout.close()
    finally:
        assert KilledCgroup(cg).cleanup() == []
