"""One network namespace per rank, joined by veth pairs to a bridge: a real network for `nic_degraded`.

Each rank runs inside its own namespace with one interface (`eth0`) on a private /24; a degraded
link is a real token-bucket (`tc ... tbf`) rate limit on that rank's veth, in both directions.
Everything is removed by `cleanup()`, which the launcher calls in `finally`.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

from eroica.lab.errors import FaultSetupError

SUBNET = "10.77.{net}.{host}"


def available() -> tuple[bool, str]:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False, "iproute2 (ip, tc) is not installed"
    probe = f"eroica-probe-{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"cannot create network namespaces: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def _run(*cmd: str) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode != 0:
        raise FaultSetupError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def add_namespace(ns: str, host_if: str, ns_if: str, ip: str, bridge: str, namespaces: list[str],
                  host_ifaces: list[str]) -> None:
    """A network namespace `ns` whose one interface (`eth0`, address `ip`/24) is a veth pair's end,
    the other end (`host_if`) on `bridge`; each made is recorded (for cleanup) as soon as it exists."""
    _run("ip", "netns", "add", ns)
    namespaces.append(ns)
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    host_ifaces.append(host_if)
    _run("ip", "link", "set", ns_if, "netns", ns)
    _run("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "name", "eth0")
    _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
    _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
    _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    _run("ip", "link", "set", host_if, "master", bridge)
    _run("ip", "link", "set", host_if, "up")


def remove_networks(namespaces: list[str], host_ifaces: list[str], bridge: str) -> list[str]:
    """Delete what add_namespace made (and the bridge); what could not be removed, in words."""
    problems = []
    for ns in namespaces:
        r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"could not delete netns {ns}: {r.stderr.strip()}")
    for host_if in host_ifaces:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    if bridge:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    return problems


@dataclass
class RankNetworks:
    world_size: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    net: int = 0
    namespaces: list[str] = field(default_factory=list)
    host_ifaces: list[str] = field(default_factory=list)
    bridge: str = ""

    def ip(self, rank: int) -> str:
        return SUBNET.format(net=self.net, host=rank + 1)

    def create(self) -> RankNetworks:
        self.net = int(self.tag, 16) % 200 + 20
        self.bridge = f"erb{self.tag}"
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for r in range(self.world_size):
                add_namespace(f"eroica-{self.tag}-r{r}", f"erv{self.tag}{r}", f"erp{self.tag}{r}", self.ip(r),
                              self.bridge, self.namespaces, self.host_ifaces)
        except Exception:
            self.cleanup()
            raise
        return self

    def limit(self, rank: int, rate_mbit: float) -> None:
        """Cap rank's link in both directions with a token bucket (no netem here)."""
        spec = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "100ms"]
        _run("tc", "qdisc", "add", "dev", self.host_ifaces[rank], "root", *spec)
        _run("ip", "netns", "exec", self.namespaces[rank], "tc", "qdisc", "add", "dev", "eth0", "root", *spec)

    def down(self, rank: int) -> None:
        """Take rank's link down (a NIC that died): its namespace keeps only loopback."""
        _run("ip", "netns", "exec", self.namespaces[rank], "ip", "link", "set", "eth0", "down")

    def prefix(self, rank: int) -> list[str]:
        # nsenter joins the network namespace only; `ip netns exec` would also remount /sys, hiding
        # the cgroup hierarchy the other faults (blkio, cpu, memory) are injected through
        if shutil.which("nsenter"):
            return ["nsenter", f"--net=/var/run/netns/{self.namespaces[rank]}", "--"]
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def cleanup(self) -> list[str]:
        problems = remove_networks(self.namespaces, self.host_ifaces, self.bridge)
        self.namespaces, self.host_ifaces, self.bridge = [], [], ""
        return problems
