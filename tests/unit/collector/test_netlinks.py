"""Which links a process's connections use, read from another network namespace (the host helper's)."""

import subprocess
import sys
import textwrap

import pytest

from eroica.collector.netlinks import job_interfaces
from eroica.lab.netns import RankNetworks, available

OK, WHY = available()

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 29517)); s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept()
    sys.stdin.readline()
""")
CLIENT = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], 29517), timeout=10)
    l = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)   # and one over loopback
    print("connected", flush=True)
    sys.stdin.readline()
""")
LOOP = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept()
    sys.stdin.readline()
""")


@pytest.mark.skipif(not OK, reason=f"needs network namespaces and veth (root): {WHY}")
def test_the_links_of_a_process_in_another_network_namespace_are_its_own() -> None:
    nets = RankNetworks(2).create()
    procs: list[subprocess.Popen[str]] = []
    try:
        def start(rank: int, code: str, *args: str) -> str:
            p = subprocess.Popen([*nets.prefix(rank), sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
            assert p.stdout is not None
            return p.stdout.readline().strip()

        assert start(0, SERVER, nets.ip(0)) == "listening"
        port = start(1, LOOP)
        assert start(1, CLIENT, nets.ip(0), port) == "connected"
        # read from this namespace, where the rank's address is no interface's: the rank's own routes
        assert job_interfaces(procs[2].pid) == {"eth0", "lo"}
        assert job_interfaces(procs[1].pid) == {"lo"}
    finally:
        for p in procs:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.close()
            p.wait(timeout=10)
            p.stdout.close()
        assert nets.cleanup() == []
