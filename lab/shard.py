"""A rank's data shard on disk, read by whoever builds its batches: the rank, or its loader workers.

A fault that puts the rank into a cgroup (a memory limit too small for the shard, a blkio group that
throttles reads) puts its loader workers there too, as a container holds both: the rank flags it in
shared memory and each worker, forked before the fault, joins on its next read.

Two ways to read:
- `mmap` (default): a window of the shard per read through the page cache (host_memory_pressure:
  once the cgroup is too small, its pages are reclaimed and read back);
- `direct`: `read_bytes` per read with O_DIRECT, so the device's speed is what counts
  (slow_storage with `--storage-fault reads`).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os

MEMORY, BLKIO = 1, 2          # the cgroups a rank has joined (bits of `Shard.joined`)


class Shard:
    def __init__(self, directory: str, rank: int, size_mb: int, read_bytes: int, direct: bool = False) -> None:
        import numpy as np

        self.path = os.path.join(directory, f"eroica-shard-{os.getpid()}-rank{rank}.bin")
        chunk = np.random.default_rng(rank).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
        with open(self.path, "wb") as fh:
            for _ in range(size_mb):
                fh.write(chunk)
        self.direct = direct
        self.size, self.pos = size_mb << 20, 0
        self.read_bytes = max(4096, read_bytes // 4096 * 4096) if direct else read_bytes
        flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
        self.fd = os.open(self.path, flags)
        self.mm = None if direct else mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
        self.buf: mmap.mmap | None = None        # page-aligned, as O_DIRECT requires (one per process)
        self.np = np
        self.joined = multiprocessing.Value("i", 0, lock=False)    # MEMORY | BLKIO, set by the rank
        self.limit_mb = multiprocessing.Value("i", 0, lock=False)
        self._mine = (0, 0)                      # (pid, bits) this process has joined

    def read(self) -> int:
        bits = self.joined.value
        if bits and self._mine != (os.getpid(), bits):
            self._follow(bits)
        if self.direct:
            if self.buf is None:
                self.buf = mmap.mmap(-1, self.read_bytes)
            n = os.preadv(self.fd, [self.buf], self.pos)
            self.pos = (self.pos + self.read_bytes) % (self.size - self.read_bytes + 1) // 4096 * 4096
            return n
        assert self.mm is not None
        view = self.np.frombuffer(self.mm, dtype=self.np.uint8, count=self.read_bytes, offset=self.pos)
        total = int(view[::4096].sum())          # touch every page of the window
        self.pos = (self.pos + self.read_bytes) % (self.size - self.read_bytes + 1)
        return total

    def squeeze(self, limit_mb: int) -> None:
        """The rank and its workers drop the shard from the page cache and join a memory cgroup too
        small to hold it (EROICA_MEMORY_CGROUP)."""
        self.limit_mb.value = limit_mb
        self.joined.value |= MEMORY
        self._follow(self.joined.value)

    def throttle(self) -> None:
        """The rank and its workers join the blkio cgroup that throttles the device (EROICA_BLKIO_CGROUP)."""
        self.joined.value |= BLKIO
        self._follow(self.joined.value)

    def _follow(self, bits: int) -> None:
        pid, done = self._mine
        done = done if pid == os.getpid() else 0
        if bits & MEMORY and not done & MEMORY:
            cgroup = os.environ["EROICA_MEMORY_CGROUP"]
            if self.mm is not None:
                self.mm.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as fh:
                fh.write(str(self.limit_mb.value << 20))
            _join(cgroup)
        if bits & BLKIO and not done & BLKIO:
            _join(os.environ["EROICA_BLKIO_CGROUP"])
        self._mine = (os.getpid(), bits)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
        os.close(self.fd)
        os.unlink(self.path)


def _join(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
