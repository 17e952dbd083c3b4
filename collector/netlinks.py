"""Which network interfaces carry a process's connections (its TCP sockets' local addresses).

The ~1 kHz byte-counter sampling that link signatures need is worth its CPU only on the links the
job actually uses: a job whose collectives all go over loopback has no per-rank link to sample.
Read from /proc/<pid>/fd (the process's sockets), /proc/<pid>/net/tcp{,6} (their addresses), and
/proc/<pid>/net/route and if_inet6: all in the process's own network namespace, which need not be
the reader's (the host's one sampler helper reads every local rank's).
"""

from __future__ import annotations

import os
import socket
import struct

ESTABLISHED = "01"


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _v4(hex_addr: str) -> str:
    return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_addr, 16)))


def _v6(hex_addr: str) -> str:
    raw = b"".join(struct.pack("<I", int(hex_addr[i:i + 8], 16)) for i in range(0, 32, 8))
    addr = socket.inet_ntop(socket.AF_INET6, raw)
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr   # v4-mapped


def connections(pid: int) -> set[tuple[str, str]]:
    """(local, remote) IP addresses of the process's established TCP connections."""
    inodes = _socket_inodes(pid)
    out = set()
    for table, conv in (("tcp", _v4), ("tcp6", _v6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == ESTABLISHED and f[9] in inodes:
                out.add((conv(f[1].split(":")[0]), conv(f[2].split(":")[0])))
    return out


def _raw_v4(addr: str) -> int:
    """An IPv4 address as /proc/net/route prints one (network-order bytes read as a host integer)."""
    return int(struct.unpack("<I", socket.inet_aton(addr))[0])


def routes_v4(pid: int) -> list[tuple[int, int, str]]:
    """(destination, mask, interface) of the IPv4 routes in the process's network namespace, most
    specific first."""
    with open(f"/proc/{pid}/net/route") as fh:
        rows = [r.split() for r in fh.read().splitlines()[1:]]
    out = [(int(f[1], 16), int(f[7], 16), f[0]) for f in rows if len(f) > 7]
    return sorted(out, key=lambda r: -bin(r[1]).count("1"))


def interfaces_v6(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/net/if_inet6") as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 6:
                    out[_v6_plain(f[0])] = f[5]
    except OSError:
        pass
    return out


def _v6_plain(hex32: str) -> str:
    return socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hex32))


def job_interfaces(pid: int) -> set[str]:
    """The interfaces the process's connections use ("lo" for loopback addresses), as the process's
    own network namespace routes them: the host helper that reads this may live in another one (a
    container's, a rank's), so nothing here depends on the reader's namespace. IPv4: the route to
    the peer's address (longest prefix); IPv6: the interface holding the local address."""
    out = set()
    routes: list[tuple[int, int, str]] | None = None
    v6: dict[str, str] | None = None
    for local, remote in connections(pid):
        if local.startswith("127.") or local == "::1":
            out.add("lo")
        elif ":" not in local:
            if routes is None:
                try:
                    routes = routes_v4(pid)
                except OSError:
                    routes = []
            peer = _raw_v4(remote)
            name = next((iface for dest, mask, iface in routes if peer & mask == dest), None)
            if name is not None:
                out.add(name)
        else:
            if v6 is None:
                v6 = interfaces_v6(pid)
            if local in v6:
                out.add(v6[local])
    return out
