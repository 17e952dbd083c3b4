"""Real network namespaces and a real token bucket, removed afterwards (root only)."""

from __future__ import annotations

import subprocess

import pytest

from eroica.cli.netns import RankNetworks, available

OK, WHY = available()
pytestmark = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable here: {WHY}")


def test_ranks_reach_each_other_and_a_cap_is_applied_then_everything_is_removed() -> None:
    nets = RankNetworks(2).create()
    try:
        ping = subprocess.run([*nets.prefix(0), "ping", "-c", "1", "-W", "2", nets.ip(1)], capture_output=True)
        if ping.returncode != 0 and b"not found" not in ping.stderr:
            pytest.fail(f"rank 0 cannot reach rank 1: {ping.stderr!r}")
        nets.limit(1, 100)
        q = subprocess.run(["tc", "qdisc", "show", "dev", nets.host_ifaces[1]], capture_output=True, text=True)
        assert "tbf" in q.stdout and "100Mbit" in q.stdout
    finally:
        names = list(nets.namespaces)
        assert nets.cleanup() == []
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in names)
