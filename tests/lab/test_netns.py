"""Real network namespaces and a real token bucket, removed afterwards (root only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eroica.lab.netns import RankNetworks, available

OK, WHY = available()
pytestmark = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable here: {WHY}")


def test_ranks_reach_each_other_and_a_cap_is_applied_then_everything_is_removed() -> None:
    nets = RankNetworks(2).create()
    try:
        server = subprocess.Popen([*nets.prefix(1), sys.executable, "-c", (
            "import socket; s = socket.socket(); s.bind(('%s', 29999)); s.listen(); c, _ = s.accept(); "
            "c.sendall(b'ok')" % nets.ip(1))])
        try:
            got = subprocess.run([*nets.prefix(0), sys.executable, "-c", (
                "import socket, time\n"
                "for _ in range(50):\n"
                "    try:\n"
                "        print(socket.create_connection(('%s', 29999), timeout=2).recv(2).decode()); break\n"
                "    except OSError: time.sleep(0.1)\n" % nets.ip(1))], capture_output=True, text=True, timeout=20)
            assert got.stdout.strip() == "ok", f"rank 0 cannot reach rank 1: {got.stderr}"
        finally:
            server.kill()
            server.wait()
        nets.limit(1, 100)
        q = subprocess.run(["tc", "qdisc", "show", "dev", nets.host_ifaces[1]], capture_output=True, text=True)
        assert "tbf" in q.stdout and "100Mbit" in q.stdout
    finally:
        names = list(nets.namespaces)
        assert nets.cleanup() == []
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in names)
