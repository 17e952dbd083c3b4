"""The hang watchdog: a thread outside the training thread that notices when a rank has made no step
for longer than the job's own history explains (eroica.collector.hang_clock: a *suspected* hang
after 20 s at the default policy, *confirmed* at max(hang_factor x the recent median step,
hang_floor_seconds, hang_pause_margin x the longest healthy pause)) and then records where the
training thread is, before the collective timeout kills the job; when the rank steps again, the
record says the stall *resolved* and how long it lasted.

Where the thread is comes from `sys._current_frames()`, read from this thread: a training thread
blocked in a collective, a lock, a queue or a sleep has released the GIL, so this thread runs and
the stuck thread's Python frames are intact (a thread spinning in Python code also yields the GIL
every few milliseconds). A thread stuck in C while holding the GIL stops this thread too, so this
thread keeps a dead man's switch: at every tick it re-arms `faulthandler.dump_traceback_later` (a C
thread that needs no GIL) for the suspicion's limit plus two polls; when this thread cannot run that
long, faulthandler writes every thread's stack to
`<run dir>/hang-native/rank-<r>.txt` after a header that names the training thread, its last step and
the limit, and the engine reads it for the rank that wrote no snapshot. Its C frames come from a
peer on the same host, whose watchdog runs py-spy on a peer that runs no Python
(eroica.collector.native_stack; it needs ptrace rights, and faulthandler's frames stand alone where
it cannot run).

Each rank also keeps a heartbeat in the job's store (`eroica/hang/hb/<rank>`: step, time, pid,
host), so a stalled rank can say which peers are alive, which stopped stepping, and which are gone
(no heartbeat, or no process with that pid on this host). Each stalled rank writes its own
snapshot (`<run dir>/hang-s<step>/rank-<r>.hang.json`): it needs nobody else, not even rank 0's store,
to be on record. `eroica diagnose` assembles and localizes them (eroica.engine.hang).
Everything here fails open: an error is one line on stderr and the watchdog stops."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eroica.collector import native_stack
from eroica.collector.faulttimer import TimerOwner
from eroica.collector.hang_clock import HangClock
from eroica.collector.hang_probe import (
    Collectives,
    bounded,
    cpu_seconds,
    flight_recorder,
    frames_of,
    read_nics,
)
from eroica.collector.heartbeats import HB_KEY, host_addresses, peers_view
from eroica.schema.hang import GONE_SECONDS, NATIVE_HEADER

EXCEPTION_SECONDS = 3.0                    # a dying process waits at most this long for its snapshot
# ... and this long of it for the store's view of its peers: a living store answers in milliseconds;
# a dead one (its host's agent exited) would only delay the snapshot while the agent stops the rank
PEERS_WHEN_DYING_SECONDS = 0.75


def _view(peers: dict[str, Any] | None) -> list[tuple[Any, ...]]:
    """What a view of the peers says that the verdict reads (not the heartbeats' ages, which grow)."""
    out = []
    for r, v in sorted((peers or {}).items()):
        v = v if isinstance(v, dict) else {}
        age = v.get("heartbeat_age_seconds")
        out.append((r, v.get("step"), v.get("seq"), v.get("process_alive"), "error" in v, age is None,
                    isinstance(age, (int, float)) and age > GONE_SECONDS))
    return out


class HangWatch:
    def __init__(self, rank: int, world_size: int, out_dir: Path | None, store: Any, clock: HangClock,
                 poll_seconds: float = 1.0, job: str = "",
                 send: Callable[[str], Any] | None = None, native: bool = False,
                 flush: Callable[[float], Any] | None = None) -> None:
        self.rank, self.world_size, self.out_dir, self.store = rank, world_size, out_dir, store
        self.clock, self.poll_seconds, self.job = clock, poll_seconds, job
        self.send = send                    # the sink's submit_hang: the service sees the hang too
        self.flush = flush                  # the sink's flush: a dying process's snapshot goes out before it exits
        self.collectives = Collectives()
        self.step = 0
        self.last_step_t = time.monotonic()
        self.thread_id: int | None = None
        self.reported_step: int | None = None
        self.reported_state: str | None = None    # suspected or confirmed, for reported_step
        self.snapshots_written = 0
        self.cpu_seconds = 0.0             # both threads' CPU so far (the overhead benchmark reports it)
        self.store_cpu_seconds = 0.0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._prev: tuple[float, dict[str, dict[str, Any]], float] | None = None
        self._thread = threading.Thread(target=self._run, name="eroica-hang", daemon=True)
        # the store on a thread of its own: a store that does not answer (rank 0's host or this rank's
        # link is down) must not keep the watchdog from writing its snapshot
        self._store_thread = threading.Thread(target=self._store_loop, name="eroica-hang-store", daemon=True)
        self.want_peers = False
        self._addrs: list[str] | None = None          # the host's addresses, read at the first heartbeat
        self.peers: dict[str, dict[str, Any]] | None = None
        self.peers_at = 0.0
        self._snap: dict[str, Any] | None = None
        self._native_path = Path(out_dir) / "hang-native" / f"rank-{rank}.txt" if native and out_dir else None
        self.native = self._native_path is not None
        self._native_fd: int | None = None
        self._native_step: int | None = None
        self._native_owner = TimerOwner()
        self._pyspied: set[int] = set()        # peers already dumped with py-spy in this process
        self._hook: Callable[..., None] | None = None
        self._prev_hook: Callable[..., Any] = sys.excepthook
        self._peers_every = 2 * poll_seconds * max(1.0, world_size / 1024)   # fewer looks at a big job's store

    def start(self) -> None:
        self.collectives.install()
        if self.native:
            self._native_owner.install()
        self._thread.start()
        if self.store is not None:
            self._store_thread.start()
        self._prev_hook = prev = sys.excepthook

        def hook(tp: Any, value: Any, tb: Any) -> None:
            self.on_exception(value, tb)
            prev(tp, value, tb)
        self._hook = hook
        sys.excepthook = hook

    def on_exception(self, exc: BaseException, tb: Any) -> None:
        """The training thread dies of an exception (gloo raises when a peer's connection drops):
        record where and why, with what the store says of the peers, before the process exits. All of
        it on a thread of its own, waited for at most EXCEPTION_SECONDS: a stalled file system or
        store must not keep a dying process (and its accelerators) alive."""
        try:
            if self._stop.is_set() or self.thread_id is None or (
                    self.reported_step == self.step and self.reported_state == "confirmed"):
                return                                # closed, never stepped, or already on record
            self.reported_step, self.reported_state = self.step, "confirmed"
            frames = []
            while tb is not None:
                frames.append(tb.tb_frame)
                tb = tb.tb_next
            stalled = time.monotonic() - self.last_step_t

            t0 = time.monotonic()

            def record() -> None:
                with contextlib.suppress(Exception):
                    if self.store is not None:        # what the store says of the peers, if it answers soon
                        t = threading.Thread(target=lambda: setattr(self, "peers", self._peers()), daemon=True)
                        t.start()
                        t.join(PEERS_WHEN_DYING_SECONDS)
                    # a collective that failed is no pause: the job cannot step again
                    snap = self._snapshot(stalled, "confirmed", frames[-1] if frames else None)
                    snap["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
                    self._write(snap)
                    if self.flush is not None:     # the process exits next: its snapshot must leave first
                        self.flush(max(0.0, EXCEPTION_SECONDS - 0.25 - (time.monotonic() - t0)))
            t = threading.Thread(target=record, name="eroica-hang-exit", daemon=True)
            t.start()
            t.join(EXCEPTION_SECONDS)
        except Exception:
            pass

    def stepped(self, step: int, seconds: float | None) -> None:
        """From the training thread at each step: cheap (a deque append and a few assignments)."""
        self.thread_id = threading.get_ident()
        self.step = step
        self.last_step_t = time.monotonic()
        if seconds is not None:
            self.clock.add(step, seconds)


    def close(self) -> None:
        self._stop.set()
        self._disarm_native()
        self._native_owner.uninstall()
        if self._hook is not None and sys.excepthook is self._hook:    # ours, still on top: put it back
            sys.excepthook = self._prev_hook
        self._hook = None
        for t in (self._thread, self._store_thread):     # both threads end with the Monitor
            if t.is_alive() and threading.current_thread() is not t:
                t.join(timeout=2 * self.poll_seconds + 1)
        if self._snap is not None:      # the training loop got past the stall to the Monitor's close: over
            with contextlib.suppress(Exception):
                self._resolved()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            c0 = time.thread_time()
            while not self._stop.wait(self.poll_seconds):
                self._tick()
                self._arm_native()
                self.cpu_seconds = time.thread_time() - c0 + self.store_cpu_seconds
        except Exception as exc:  # fail open: the job runs on without the watchdog
            print(f"eroica hang watchdog [rank {self.rank}]: {exc!r}; it stops, the job runs on",
                  file=sys.stderr, flush=True)

    def _arm_native(self) -> None:
        """Re-arm the dead man's switch (see the module's doc): one small pwrite and one re-arm per
        tick. After a dump, once the rank steps again, the file goes back to its header."""
        if not self.native or self.thread_id is None or not self.clock.ready or self._stop.is_set():
            return
        if self._native_owner.user_armed:                  # the job's own code uses the timer: it is theirs
            self._disarm_native()
            self.native = False
            print(f"eroica hang watchdog [rank {self.rank}]: the job arms faulthandler.dump_traceback_later "
                  "itself; the native dump is left to it", file=sys.stderr, flush=True)
            return
        try:
            fd = self._native_fd
            if fd is None:
                assert self._native_path is not None
                self._native_path.parent.mkdir(parents=True, exist_ok=True)
                fd = self._native_fd = os.open(self._native_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            elif self._native_step != self.step and os.fstat(fd).st_size > NATIVE_HEADER:
                os.ftruncate(fd, NATIVE_HEADER)         # a dump from a stall the rank came out of
            limit = self.clock.suspect_after()         # the switch fires at the suspicion's limit
            header = json.dumps({
                "schema": "eroica.hang-native/v1", "job": self.job[:120], "rank": self.rank,
                "world_size": self.world_size, "host": socket.gethostname()[:64], "pid": os.getpid(),
                "thread": f"0x{self.thread_id:016x}",
                "last_step": self.step, "last_step_wall_time": time.time() - (time.monotonic() - self.last_step_t),
                **self.clock.as_fields(), "fires_after_seconds": round(limit + 2 * self.poll_seconds, 2)})
            os.pwrite(fd, header.encode()[:NATIVE_HEADER - 1].ljust(NATIVE_HEADER - 1) + b"\n", 0)
            os.lseek(fd, 0, os.SEEK_END)
            self._native_step = self.step
            self._native_owner.arm(limit + 2 * self.poll_seconds, fd)
        except Exception:
            self._disarm_native()
            self.native = False                          # fail open: the Python snapshots still work

    def _disarm_native(self) -> None:
        if self._native_fd is None:
            return
        with contextlib.suppress(Exception):
            if not self._native_owner.user_armed:
                self._native_owner.cancel()
            fired = os.fstat(self._native_fd).st_size > NATIVE_HEADER
            os.close(self._native_fd)
            if not fired and self._native_path is not None:
                self._native_path.unlink()
        self._native_fd = None

    def _store_loop(self) -> None:
        try:
            c0 = time.thread_time()
            while not self._stop.wait(2 * self.poll_seconds):
                self._heartbeat()
                if self.want_peers and time.time() - self.peers_at >= self._peers_every:
                    self.peers, self.peers_at = self._peers(), time.time()
                self.store_cpu_seconds = time.thread_time() - c0
        except Exception:
            pass

    def _tick(self) -> None:
        now = time.monotonic()
        self._sample(now)
        stalled = now - self.last_step_t
        if self.thread_id is None or not self.clock.ready:
            return
        if self._snap is not None and self.reported_step != self.step:
            self._resolved()
        limit = self.clock.suspect_after()
        self.want_peers = stalled > self.clock.early_after() / 2
        state = self.clock.state(stalled)
        apart = None
        if state is None and stalled > self.clock.early_after() and self.reported_step != self.step:
            apart = self._peers_apart(stalled)
            state = "suspected" if apart else None
        if state is not None and (self.reported_step != self.step or (state, self.reported_state) == (
                "confirmed", "suspected")):
            self.reported_step, self.reported_state = self.step, state
            before = self._snap if self._snap is not None and self._snap["last_step"] == self.step else None
            self._snap = self._snapshot(stalled, state)
            # a confirmation keeps why (and when) the same stall was first suspected
            self._snap["suspected_because"] = before["suspected_because"] if before is not None else (
                apart or f"no step for {stalled:.1f} s (suspected after {limit:.1f} s)")
            self._write(self._snap)
        elif self._snap is not None and self.reported_step == self.step and \
                self.peers_at > self._snap.get("peers_wall_time", self._snap["wall_time"]):
            # the peers as the store saw them after the stall: written (and sent) again only when what it
            # says of them changed (a peer stepped, died, went silent), not at every look
            changed = _view(self.peers) != _view(self._snap["peers"])
            self._snap = {**self._snap, "peers": self.peers, "peers_wall_time": self.peers_at}
            if changed:
                self._write(self._snap, quiet=True)
            self._dump_silent_peers(limit)

    def _peers_apart(self, stalled: float) -> str | None:
        """Why this stall is a suspicion already: the peers' heartbeats, read since the stall began, say
        they stand at another collective sequence number than this rank (so one rank has not entered a
        collective the others wait in); None when they do not, or have not been read yet."""
        peers = self.peers or {}
        if not peers or self.peers_at < time.time() - stalled:
            return None
        mine = self.collectives.seq()
        theirs = {int(r): v.get("seq") for r, v in peers.items() if isinstance(v, dict) and v.get("seq") is not None}
        other = sorted(r for r, s in theirs.items() if s != mine)
        if mine is None or not other:
            return None
        return (f"after {stalled:.1f} s without a step rank {self.rank} stands at collective #{mine} and "
                f"{len(other)} of {len(theirs)} peer(s) at another (rank {other[0]}: #{theirs[other[0]]})")

    def _resolved(self) -> None:
        """The rank stepped again after a snapshot: its record says the stall is over and how long it lasted."""
        snap, self._snap, self.reported_state = self._snap, None, None
        assert snap is not None
        if snap.get("error"):
            return                                       # a failed collective does not come back
        resumed = time.time() - (time.monotonic() - self.last_step_t)
        started = snap["wall_time"] - snap["stalled_seconds"]
        self._write({**snap, "state": "resolved", "resolved_wall_time": resumed,
                     "resolved_after_seconds": round(max(0.0, resumed - started), 2), "resumed_step": self.step},
                    quiet=True)
        print(f"eroica [rank {self.rank}]: stepped again after {resumed - started:.0f} s: the suspected hang at step "
              f"{snap['last_step']} resolved", file=sys.stderr, flush=True)

    def _dump_silent_peers(self, limit: float) -> None:
        """A snapshot for each peer of this host that runs no Python, read with py-spy
        (eroica.collector.native_stack): written once by the first peer there, and posted."""
        for r, view in native_stack.silent_peers(self.peers or {}, limit):
            if r in self._pyspied:
                continue
            self._pyspied.add(r)
            path = native_stack.claim(self.out_dir, r)
            if self.out_dir is not None and path is None:
                continue                                 # a peer on this host already has it
            snap = native_stack.snapshot_for(r, view, self.rank, self.world_size, self.job, self.clock.confirm_after(),
                                             limit)
            if path is not None:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(json.dumps(snap, indent=1))
                tmp.replace(path)
            if self.send is not None:
                with contextlib.suppress(Exception):
                    self.send(json.dumps(snap))

    def _sample(self, now: float) -> None:
        nics, cpu = read_nics(), cpu_seconds()
        self._last = (now, nics, cpu)
        if self._prev is None or now - self._prev[0] >= 3 * self.poll_seconds:
            self._prev = self._last

    def _heartbeat(self) -> None:
        if self.store is None:
            return
        with contextlib.suppress(Exception):
            if self._addrs is None:
                self._addrs = host_addresses()
            self.store.set(HB_KEY.format(rank=self.rank), json.dumps(
                {"step": self.step, "wall_time": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
                 "addrs": self._addrs, "seq": self.collectives.seq()}))

    def _peers(self) -> dict[str, dict[str, Any]]:
        """Each peer of a bounded sample as this rank sees it through the store (heartbeats.peers_view)."""
        return peers_view(self.store, self.rank, self.world_size) if self.store is not None else {}

    def _snapshot(self, stalled: float, state: str, frame: Any = None) -> dict[str, Any]:
        frame = frame if frame is not None else sys._current_frames().get(self.thread_id or -1)
        if not hasattr(self, "_last"):
            self._sample(time.monotonic())
        (t1, nics1, cpu1), (t0, nics0, cpu0) = self._last, self._prev or self._last
        dt = max(t1 - t0, 1e-3)
        nic = {n: {"operstate": v["operstate"],
                   "rx_bytes_per_second": round((v["rx_bytes"] - nics0.get(n, v)["rx_bytes"]) / dt, 1),
                   "tx_bytes_per_second": round((v["tx_bytes"] - nics0.get(n, v)["tx_bytes"]) / dt, 1)}
               for n, v in nics1.items()}
        return {
            "schema": "eroica.hang/v1", "job": self.job, "rank": self.rank, "world_size": self.world_size,
            "host": socket.gethostname(), "pid": os.getpid(), "wall_time": time.time(),
            "last_step": self.step, "stalled_seconds": round(stalled, 2), "error": None, "state": state,
            **self.clock.as_fields(),
            "stack": frames_of(frame) if frame is not None else [],
            "stack_gap": None if frame is not None else "the training thread was not found",
            "seq": self.collectives.seq(), "last_entered": self.collectives.entered,
            "last_completed": self.collectives.completed, "flight_recorder": bounded(flight_recorder, 2.0),
            "process_cpu_ratio": round((cpu1 - cpu0) / dt, 3), "nics": nic,
            "peers": self.peers if self.peers is not None else {},
        }

    def _write(self, snap: dict[str, Any], quiet: bool = False) -> None:
        if self.send is not None:
            with contextlib.suppress(Exception):
                self.send(json.dumps(snap))
        if self.out_dir is None:
            return
        d = Path(self.out_dir) / f"hang-s{snap['last_step']:06d}"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".rank-{self.rank}.hang.json.tmp"
        tmp.write_text(json.dumps(snap, indent=1))
        tmp.replace(d / f"rank-{self.rank}.hang.json")
        self.snapshots_written += 1
        if not quiet:
            print(f"eroica [rank {self.rank}]: no step for {snap['stalled_seconds']:.3g} s: {snap['state']} hang "
                  f"(suspected after {snap['suspect_after_seconds']:.3g} s, confirmed after "
                  f"{snap['limit_seconds']:.3g} s): snapshot in {d}", file=sys.stderr, flush=True)
