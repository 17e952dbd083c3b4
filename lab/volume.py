"""A slow volume on this machine, for tests that need one rank's disk to be slow while the others'
are not: a file-backed ext4 filesystem on a loop device, mounted `sync` (each write reaches the device
before write() returns, as on a volume without a write cache), and a cgroup v1 blkio group that caps
writes to that one device. A process in the group that writes there waits for the device at the cap;
its writes to other disks, and every other process, are untouched. Everything made is removed on exit,
even when the body fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eroica.lab.errors import FaultSetupError
from eroica.lab.launch import BlkioCgroup

BLKIO = Path("/sys/fs/cgroup/blkio")


def unavailable() -> str | None:
    """Why no slow volume can be made here (None when one can)."""
    if os.geteuid() != 0:
        return "a slow volume needs root (a loop device, a mount and a blkio cgroup)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not (BLKIO / "blkio.throttle.write_bps_device").exists() or not os.access(BLKIO, os.W_OK):
        return "needs a writable cgroup v1 blkio controller at /sys/fs/cgroup/blkio"
    return None


@dataclass(frozen=True)
class SlowVolume:
    mount: Path              # where the slow filesystem is mounted
    cgroup: Path             # the blkio group whose members' writes to it are capped

    def enter(self, command: str) -> str:
        """`command` as a shell line that first joins the capped group (its children follow)."""
        return f"echo $$ > {self.cgroup / 'cgroup.procs'} && exec {command}"


def _run(*cmd: str) -> str:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise FaultSetupError(f"{' '.join(cmd)}: {res.stderr.strip()[:300]}")
    return res.stdout.strip()


@contextmanager
def slow_volume(write_bytes_per_second: int, size_mb: int = 128, image_dir: str = "/var/tmp") -> Iterator[SlowVolume]:
    """A `size_mb` volume whose writes from the returned cgroup are capped at `write_bytes_per_second`."""
    why = unavailable()
    if why:
        raise FaultSetupError(why)
    tag = uuid.uuid4().hex[:8]
    image = Path(image_dir) / f"eroica-volume-{tag}.img"
    mount = Path(image_dir) / f"eroica-volume-{tag}"
    cgroup: BlkioCgroup | None = None
    device = None
    mounted = False
    try:
        with image.open("wb") as fh:
            fh.truncate(size_mb * 1024 * 1024)
        device = _run("losetup", "--find", "--show", str(image))
        _run("mkfs.ext4", "-q", device)
        mount.mkdir()
        _run("mount", "-o", "sync", device, str(mount))
        mounted = True
        mount.chmod(0o1777)
        cgroup = BlkioCgroup.create(directory=str(mount), bps=write_bytes_per_second)   # the loop device's writes
        yield SlowVolume(mount=mount, cgroup=cgroup.path)
    finally:
        notes = cgroup.cleanup() if cgroup is not None else []
        if mounted:
            res = subprocess.run(["umount", str(mount)], capture_output=True, timeout=60)
            if res.returncode != 0:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=60)
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60)
        if mount.exists():
            mount.rmdir()
        image.unlink(missing_ok=True)
        if notes:
            raise FaultSetupError("; ".join(notes))
