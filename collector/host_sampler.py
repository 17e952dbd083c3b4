"""One sampler helper per host (`sampler_scope="host"`, the default).

Every rank's helper (`sampler_proc`) wakes on its own: each 20 ms tick costs ~40 us of CPU just to
wake, before it reads anything, and on a multi-host job each rank's helper also wakes at ~1 kHz in
bursts to sample its link. On a host with 8 ranks that is 8 sets of wake-ups competing with the
training processes for the same cores. The host helper ticks every local rank's sampler on one
thread per interval, so the host pays one wake-up per tick: on 4 ranks sampled for 8 s, one thread
cost 0.17% of a core per rank against 0.37% for four helpers (the reads are the same).

The first rank to start on the host spawns it (under a lock file); the others connect to its Unix
socket in a per-user directory (`$TMPDIR/eroica-<uid>/`, mode 0700). The helper takes each rank's
pid from the socket's peer credentials, never from what the rank says. It serves ranks of the same
user running the same Python and eroica (the socket's name holds both), exits LINGER_SECONDS after
its last rank disconnects, and detaches from the rank that spawned it (its own session), so a
rank's exit does not end the others' sampling.

Fail-open: anything that goes wrong with the host helper (no socket directory, a helper that does
not answer in time or exits) makes the rank fall back to a helper of its own for this and later
windows; a window that was already open records the failure as a gap.

Protocol (one connection per rank, for the life of its Monitor):
`attach <tid> <gpu_index or -1>\\n` -> `ok <helper pid>\\n`; then the per-rank helper's `start ...` and
`stop` (`sampler_proc`); EOF ends the rank's sampling.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from eroica.collector.nvml import gpu_index_for_rank
from eroica.collector.proc_sources import CgroupCpu, close_cached_files
from eroica.collector.sampler import SampleSeries, Ticker
from eroica.collector.sampler_proc import HELPER_NICE, RankSampling, SamplerClient, read_exact, read_series
from eroica.schema.patterns import CollectorGap

log = logging.getLogger("eroica.collector")

PROTOCOL = 1
WHO = "host sampler"
LINGER_SECONDS = 5.0          # the helper outlives its last rank this long (a Monitor restarting)
FIRST_RANK_SECONDS = 30.0     # a helper no rank ever reached exits after this long
SPAWN_SECONDS = 10.0          # how long a rank waits for the helper it spawned to listen


def socket_path() -> Path:
    """Where this user's host helper for this Python and this eroica listens."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("eroica")
    except PackageNotFoundError:
        ours = "unknown"
    key = hashlib.sha1(f"{PROTOCOL} {sys.executable} {ours} {Path(__file__).resolve()}".encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"eroica-{os.getuid()}" / f"sampler-{key}.sock"


def _private_dir(path: Path) -> None:
    """The socket's directory exists, is a real directory, is ours and no one else's: else raise."""
    d = path.parent
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{d} is not a directory of this user's alone (mode {oct(st.st_mode)})")
    if len(str(path).encode()) > 100:
        raise OSError(f"socket path too long for a Unix socket: {path}")


# ------------------------------------------------------------------------------------------ helper
class HostHelper:
    """The helper process's state: the listening socket, the shared tickers, the attached ranks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.tickers: dict[tuple[float, float], Ticker] = {}
        self.attached: dict[int, int] = {}     # connection -> the rank's pid
        self.ever = False
        self.left_at = time.monotonic()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()               # a stale socket: the spawner holds the lock, no helper answered
        self.listener.bind(str(path))
        self.inode = os.stat(path).st_ino
        self.listener.listen(256)
        self.listener.settimeout(0.5)

    def ticker(self, interval: float, duty: float) -> Ticker:
        with self.lock:
            t = self.tickers.get((interval, duty))
            if t is None:
                t = self.tickers[(interval, duty)] = Ticker(interval, duty)
            return t

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if self._idle() and self._retire():
                    return
                continue
            except OSError:
                return
            try:
                pid, uid = _peer(conn)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.ever = True
                self.attached[id(conn)] = pid
            threading.Thread(target=self._rank, args=(conn, pid, uid), name="eroica-rank", daemon=True).start()

    def _idle(self) -> bool:
        """No rank left whose process lives: ranks that disconnected, or died while a read in this
        helper hung (their threads here are stuck, not counted)."""
        with self.lock:
            if any(_alive(p) for p in self.attached.values()):
                self.left_at = time.monotonic()
                return False
            return time.monotonic() - self.left_at > (LINGER_SECONDS if self.ever else FIRST_RANK_SECONDS)

    def _retire(self) -> bool:
        """Stop listening, under the spawners' lock so that no rank spawns or connects half-way."""
        with _locked(self.path, timeout=1.0) as held:
            if not held:
                return False
            if not self._idle():
                return False
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self.inode:
                    self.path.unlink()
            self.listener.close()
        for t in self.tickers.values():
            t.close()
        return True

    def _rank(self, conn: socket.socket, pid: int, uid: int) -> None:
        """One rank's connection, `pid` and `uid` from its peer credentials."""
        rank: RankSampling | None = None
        try:
            f = conn.makefile("rb")
            out = conn.makefile("wb")
            cmd = f.readline().split()
            if uid != os.getuid() or pid <= 0 or len(cmd) != 3 or cmd[0] != b"attach":
                return
            tid, gpu = int(cmd[1]), int(cmd[2])
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                return
            rank = RankSampling(pid, tid, gpu if gpu >= 0 else None)
            out.write(f"ok {os.getpid()}\n".encode())
            out.flush()
            for line in f:
                words = line.split()
                if not words:
                    continue
                if words[0] == b"start" and not rank.running:
                    rank.start(float(words[1]), int(words[2]), float(words[3]), float(words[4]), self.ticker)
                    out.write(b"ok\n")
                    out.flush()
                elif words[0] == b"stop" and rank.running:
                    out.write(rank.stop())
                    out.flush()
        except Exception:
            pass                         # the rank sees EOF or a timeout and falls back
        finally:
            with contextlib.suppress(Exception):
                if rank is not None and rank.running:
                    rank.stop()
            with contextlib.suppress(OSError):
                conn.close()
            # the /proc descriptors cached for reads (proc_sources) stay open while the helper lives:
            # ranks share them (/proc/stat), and closing them under another rank's read is worse than
            # a few stale ones of ranks gone (bounded by the job's ranks; the helper leaves with them)
            with self.lock:
                self.attached.pop(id(conn), None)
                self.left_at = time.monotonic()


def _peer(conn: socket.socket) -> tuple[int, int]:
    """The connected process's pid and uid, from the kernel (SO_PEERCRED), not from what it says."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[bool]:
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    held = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        yield held
    finally:
        os.close(fd)                     # releases the lock


def helper_main(path: Path) -> None:
    """Detach (a child in its own session, reparented when this process exits at once), listen, say
    `ready` on stdout, and serve until the last rank has gone."""
    if os.fork():
        os._exit(0)
    os.setsid()
    with contextlib.suppress(OSError):
        os.nice(HELPER_NICE)
    helper = HostHelper(path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    helper.serve()
    os._exit(0)                          # a rank's thread stuck in a hung read does not hold the exit


# ------------------------------------------------------------------------------------------ client
class HostSamplerClient:
    """A rank's handle on the host helper, with the same calls as `SamplerClient`. Every failure
    falls back to a helper of the rank's own (the failed window keeps a gap); nothing raises."""

    def __init__(self, pid: int, tid: int, timeout_seconds: float = 5.0) -> None:
        self.pid, self.tid, self.timeout = pid, tid, timeout_seconds
        self._gaps: list[CollectorGap] = []
        self.sock: socket.socket | None = None
        self.helper_pid = 0
        self.own: SamplerClient | None = None
        self._running = False
        try:
            self.sock = connect_or_spawn(tid, timeout_seconds)
            self.helper_pid = int(self._line(time.monotonic() + timeout_seconds).split()[1])
            why = quota_elsewhere(self.helper_pid)
            if why:
                raise RuntimeError(why)
        except Exception as exc:         # nothing is lost: the rank's own helper samples the same
            log.info("eroica collector: no host sampler (%r); this rank runs a helper of its own", exc)
            self._fall_back(None)

    @property
    def gaps(self) -> list[CollectorGap]:
        return self._gaps + (self.own.gaps if self.own is not None else [])

    @property
    def scope(self) -> str:
        return "host" if self.own is None else "rank"

    def _fall_back(self, what: str | None, exc: BaseException | None = None) -> None:
        if what is not None:
            self._gaps.append(CollectorGap(source="sampler", reason=f"host sampler {what}: {exc!r}"[:200]))
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._running = False
        if self.own is None:
            self.own = SamplerClient(self.pid, self.tid, self.timeout)

    def _fd(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def _line(self, deadline: float) -> str:
        buf = b""
        while not buf.endswith(b"\n"):
            buf += read_exact(self._fd(), 1, deadline, WHO)
            if len(buf) > 64:
                raise RuntimeError(f"unexpected answer {buf!r}")
        return buf.decode()

    def start(self, interval: float, capacity: int, nic_interval: float = 0.0, nic_duty: float = 1.0) -> bool:
        if self.own is not None:
            return self.own.start(interval, capacity, nic_interval, nic_duty)
        try:
            assert self.sock is not None
            self.sock.sendall(f"start {interval} {capacity} {nic_interval} {nic_duty}\n".encode())
            if read_exact(self._fd(), 3, time.monotonic() + self.timeout, WHO) != b"ok\n":
                raise RuntimeError("unexpected answer to start")
            self._running = True
            return True
        except Exception as exc:
            self._fall_back("start failed; this rank samples on its own", exc)
            assert self.own is not None
            return self.own.start(interval, capacity, nic_interval, nic_duty)

    def stop(self) -> SampleSeries | None:
        if self.own is not None:
            return self.own.stop()
        if not self._running:
            return None
        self._running = False
        try:
            assert self.sock is not None
            self.sock.sendall(b"stop\n")
            return read_series(self._fd(), time.monotonic() + self.timeout, WHO)
        except Exception as exc:
            self._fall_back("stop failed; this rank samples on its own from the next window", exc)
            return None

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        if self.own is not None:
            self.own.close()


def quota_elsewhere(helper_pid: int) -> str | None:
    """Why a rank should not be sampled by this helper: it runs in another CPU cgroup, one with a CFS
    quota (a throttled container would starve every rank's sampling, not only its own)."""
    try:
        mine, theirs = CgroupCpu(os.getpid()), CgroupCpu(helper_pid)
        if mine.directory == theirs.directory:
            return None
        quota = theirs.quota_cores()
        return None if quota is None else f"the host sampler runs in {theirs.directory}, with a {quota:.2f}-core quota"
    except OSError:
        return None                       # no CPU cgroup to tell apart: nothing throttles the helper alone
    finally:
        close_cached_files()              # the training process keeps no /proc descriptor open


def _attach(path: Path, tid: int, timeout: float) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(f"attach {tid} {_gpu_index()}\n".encode())
        s.settimeout(None)
        return s
    except BaseException:
        s.close()
        raise


def _gpu_index() -> int:
    try:
        return gpu_index_for_rank()
    except Exception:
        return -1


def connect_or_spawn(tid: int, timeout: float) -> socket.socket:
    """A connection to the host helper, spawning it when none listens (one spawner at a time)."""
    path = socket_path()
    _private_dir(path)
    with contextlib.suppress(OSError):
        return _attach(path, tid, timeout)
    with _locked(path, timeout=SPAWN_SECONDS) as held:
        if not held:
            raise TimeoutError("the host sampler's lock was held too long")
        with contextlib.suppress(OSError):
            return _attach(path, tid, timeout)    # another rank spawned it meanwhile
        proc = subprocess.Popen([sys.executable, "-m", "eroica.collector.host_sampler", str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                close_fds=True)
        try:
            assert proc.stdout is not None
            ready = select.select([proc.stdout], [], [], SPAWN_SECONDS)[0] and proc.stdout.readline()
            if ready != b"ready\n":
                raise RuntimeError(f"the host sampler did not start: {ready!r}")
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait(timeout=SPAWN_SECONDS)   # the forking parent; the helper is its detached child
        return _attach(path, tid, timeout)


def open_sampler(pid: int, tid: int, scope: str) -> HostSamplerClient | SamplerClient:
    """The rank's sampler client: the host's helper (`scope="host"`) or one of its own (`"rank"`)."""
    return HostSamplerClient(pid, tid) if scope == "host" else SamplerClient(pid, tid)


if __name__ == "__main__":
    helper_main(Path(sys.argv[1]))
