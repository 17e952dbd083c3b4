"""Which network interfaces carry a process's connections (its TCP sockets' local addresses).

The ~1 kHz byte-counter sampling that link signatures need is worth its CPU only on the links the
job actually uses: a job whose collectives all go over loopback has no per-rank link to sample.
Read from /proc/<pid>/fd (the process's sockets), /proc/<pid>/net/tcp{,6} (their local addresses)
and the interfaces' addresses (SIOCGIFADDR for IPv4, /proc/net/if_inet6 for IPv6), all in the
process's own network namespace (the sampler helper is its child).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

SIOCGIFADDR = 0x8915
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


def local_addresses(pid: int) -> set[str]:
    """Local IP addresses of the process's established TCP connections."""
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
                out.add(conv(f[1].split(":")[0]))
    return out


def interface_addresses() -> dict[str, str]:
    """address -> interface name, for the interfaces of this network namespace."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                out[socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])] = name
            except OSError:        # no IPv4 address on this interface
                continue
    try:
        with open("/proc/net/if_inet6") as fh:
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
    """The interfaces the process's connections use ("lo" for loopback addresses)."""
    addrs = local_addresses(pid)
    by_addr = interface_addresses()
    out = set()
    for a in addrs:
        if a.startswith("127.") or a == "::1":
            out.add("lo")
        elif a in by_addr:
            out.add(by_addr[a])
    return out
