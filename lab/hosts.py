"""Simulated hosts on one machine, for multi-node jobs: each host is its own network namespace (one
`eth0` on a bridge), hostname (UTS namespace), `/tmp` and `/etc/hosts` (mount namespace: each host
runs its own sampler helper, and the hosts resolve each other by name) and cpu cgroup. The root
namespace reaches every host over the bridge (`BRIDGE_IP`), where a test's `eroica serve` listens.

A host-wide fault is real: the host's link capped (`tc ... tbf`) or taken down, the host's cgroup
given a CFS quota, or its processes killed. Everything is removed by `cleanup()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from eroica.lab.netns import _run, add_namespace, remove_networks
from eroica.lab.netns import available as netns_available

CPU_ROOT = Path("/sys/fs/cgroup/cpu")


def available() -> tuple[bool, str]:
    """Whether hosts can be simulated here (network namespaces, nsenter/unshare, root, cgroup v1 cpu)."""
    for tool in ("nsenter", "unshare", "mount"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    if os.geteuid() != 0:
        return False, "simulated hosts need root (namespaces, mounts, cgroups)"
    if not os.access(CPU_ROOT, os.W_OK):
        return False, "cgroup v1 cpu controller not writable at /sys/fs/cgroup/cpu"
    return netns_available()


@dataclass
class Hosts:
    n: int
    root: Path                                  # per-host files (hosts file, private /tmp contents)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    net: int = 0
    namespaces: list[str] = field(default_factory=list)
    host_ifaces: list[str] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)
    bridge: str = ""

    @property
    def bridge_ip(self) -> str:
        return f"10.78.{self.net}.254"

    def ip(self, i: int) -> str:
        return f"10.78.{self.net}.{i + 1}"

    def name(self, i: int) -> str:
        return f"host{i}-{self.tag}"

    def create(self) -> Hosts:
        self.net = int(self.tag, 16) % 200 + 20
        self.bridge = f"erh{self.tag}"
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.ip(i)} {self.name(i)}\n" for i in range(self.n)) + f"{self.bridge_ip} eroica-service\n")
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            parent = CPU_ROOT / f"eroica-hosts-{self.tag}"
            parent.mkdir()
            self.cgroups.append(parent)
            (parent / "cpu.shares").write_text("1024")   # the hosts together weigh what the service does
            for i in range(self.n):
                add_namespace(f"eroica-{self.tag}-h{i}", f"erhv{self.tag}{i}", f"erhp{self.tag}{i}", self.ip(i),
                              self.bridge, self.namespaces, self.host_ifaces)
                cg = parent / f"h{i}"
                cg.mkdir()
                self.cgroups.append(cg)
                (self.root / f"h{i}" / "tmp").mkdir(parents=True, exist_ok=True)
        except Exception:
            self.cleanup()
            raise
        return self

    def command(self, i: int, argv: list[str], keep: list[Path]) -> list[str]:
        """`argv` run on host `i`: in its network namespace (nsenter: /sys stays as it is, so cgroups
        are read as on a real host), with its own hostname, /tmp and /etc/hosts, in its cgroup.
        `keep`: paths under /tmp that must stay visible on the host (the run directory, the checkout)."""
        enter = [sys.executable, "-m", "eroica.lab.hostenter", "--hostname", self.name(i), "--cgroup",
                 str(self.cgroups[i + 1]), "--tmp", str(self.root / f"h{i}" / "tmp"), "--hosts-file",
                 str(self.root / "hosts")]
        for k in keep:
            enter += ["--keep", str(k)]
        return ["nsenter", f"--net=/var/run/netns/{self.namespaces[i]}", "--", "unshare", "--uts", "--mount",
                "--propagation", "private", "--", *enter, "--", *argv]

    def cap_link(self, i: int, rate_mbit: float) -> None:
        """The host's link capped in both directions (a degraded NIC, a bad cable, a congested port)."""
        spec = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "32kb", "latency", "200ms"]
        _run("tc", "qdisc", "add", "dev", self.host_ifaces[i], "root", *spec)
        _run("ip", "netns", "exec", self.namespaces[i], "tc", "qdisc", "add", "dev", "eth0", "root", *spec)

    def link_down(self, i: int) -> None:
        _run("ip", "link", "set", self.host_ifaces[i], "down")

    def throttle(self, i: int, cores: float) -> None:
        """The host's cgroup limited to `cores` CPUs (CFS quota): every process on it is throttled."""
        cg = self.cgroups[i + 1]
        (cg / "cpu.cfs_period_us").write_text("100000")
        (cg / "cpu.cfs_quota_us").write_text(str(int(100000 * cores)))

    def pids(self, i: int) -> list[int]:
        try:
            return [int(p) for p in (self.cgroups[i + 1] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self, i: int) -> None:
        """Every process of host `i` killed (the host died)."""
        for p in self.pids(i):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass

    def cleanup(self) -> list[str]:
        for i in range(len(self.cgroups) - 1):
            self.kill(i)
        problems = remove_networks(self.namespaces, self.host_ifaces, self.bridge)
        for cg in reversed(self.cgroups):
            for _ in range(50):
                try:
                    cg.rmdir()
                    break
                except OSError:
                    for p in (cg / "cgroup.procs").read_text().split() if (cg / "cgroup.procs").exists() else []:
                        try:
                            os.kill(int(p), signal.SIGKILL)
                        except OSError:
                            pass
                    time.sleep(0.1)
            else:
                problems.append(f"could not remove cgroup {cg}")
        self.namespaces, self.host_ifaces, self.cgroups, self.bridge = [], [], [], ""
        return problems
