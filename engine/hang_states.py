"""Where each rank stands in a hang, beside its peers: the comparison behind eroica.engine.hang, on
the ranks' typed snapshots (eroica.schema.hang).

- a rank whose sequence number is behind never reached the collective the others wait in: it is
  stuck before it (data loading, a lock, I/O, a loop), and its stack says where;
- ranks at the same number that stand in different collectives (one inside `backward`'s all-reduce,
  the others in an explicit `all_reduce`), or in the same one with other shapes, are desynchronized:
  the minority is the culprit;
- a rank that wrote nothing and whose process is gone (a peer on its host checked its pid), or whose
  peers' collectives failed with a dropped connection, died;
- all ranks in the same collective with one rank's link down: the link."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from eroica.schema.hang import (
    GONE_SECONDS,
    CollectiveCall,
    FlightRecord,
    Frame,
    HangFrame,
    HangRankState,
    HangSnapshot,
    PeerView,
    State,
)

LIBRARY = ("/torch/", "/eroica/", "/threading.py", "/queue.py", "/selectors.py", "/socket.py", "/contextlib.py",
           "/multiprocessing/", "/site-packages/", "/lib/python3", "<frozen")
RAN_AHEAD = "ran ahead"
FAILED = "; then its collective failed: "
# a collective that failed because a peer's connection went away (gloo's words; NCCL's abort)
LOST_PEER = re.compile(r"(reset|closed) by peer|broken pipe|connection refused|remote process exited", re.I)
# what gloo says on the rank that received a skipped or reshaped collective's data
WRONG_SIZE = re.compile(r"size doesn't match|doesn't match expected", re.I)
SILENT_LISTED = 1024      # silent ranks stated one by one; past it, only those a peer said something of


def native_detail(s: HangSnapshot) -> str:
    """What is known of a rank that ran no Python: faulthandler's dump, a peer's py-spy reading, or both."""
    frames = s.native_frames
    source = "faulthandler's dump" if s.faulthandler else f"rank {s.read_by_rank}'s py-spy reading"
    gil = "holds the GIL" if s.owns_gil is not False else "is stuck"
    text = (f"its training thread {gil} inside native code, so its watchdog could not run: the stack is {source}, "
            f"{s.stalled_seconds:.0f} s after its last step (step {s.last_step})")
    if frames:
        text += f"; in C: {' <- '.join(frames[:4])} (py-spy, read by rank {s.read_by_rank} on its host)"
    elif s.native_gap:
        text += f"; its C frames: {s.native_gap}"
    return text


def user_frame(stack: list[Frame]) -> HangFrame | None:
    for f in stack:
        if not any(m in f.file for m in LIBRARY):
            return HangFrame(**f.model_dump())
    return HangFrame(**stack[0].model_dump()) if stack else None


def _open(s: HangSnapshot) -> CollectiveCall | None:
    """The explicit collective the rank entered and has not completed."""
    ent, done = s.last_entered, s.last_completed
    return ent if ent is not None and ent != done else None


def _current(s: HangSnapshot) -> str:
    """The collective the rank stands in: an explicit one still open, else where its thread waits."""
    if (ent := _open(s)) is not None:
        return f"{ent.op}{f' {ent.shape}' if ent.shape is not None else ''} at {Path(ent.file).name}:{ent.line}"
    if any("/torch/autograd/" in f.file for f in s.stack):
        return "backward (DDP's gradient all-reduce)"
    u = user_frame(s.stack)
    return f"{u.function} at {Path(u.file).name}:{u.line}" if u else "unknown"


def _key(rec: CollectiveCall | FlightRecord) -> tuple[str, str]:
    return str(rec.op), str(rec.shape if isinstance(rec, CollectiveCall) else rec.sizes)


def _mismatch(s: HangSnapshot, snaps: list[HangSnapshot]) -> str | None:
    """The collective this rank issued where its peers issued another operation or shape at the same
    sequence number: from the collector's wrappers (an explicit collective still open) or from torch's
    Flight Recorder (any collective, DDP's own included). The peers may have completed theirs and
    gone on (gloo completes the smaller side), so what they entered and completed both count."""
    mine: list[tuple[int, CollectiveCall | FlightRecord]] = []
    if (ent := _open(s)) is not None and ent.seq is not None:
        mine.append((ent.seq + 1, ent))                   # the wrapper records the number before the call
    fr = s.flight_recorder or []
    if fr and fr[-1].seq is not None:
        mine.append((fr[-1].seq, fr[-1]))
    for seq, rec in mine:
        theirs: Counter[tuple[str, str]] = Counter()
        for o in snaps:
            if o is s:
                continue
            recs: list[tuple[int, CollectiveCall | FlightRecord]] = []
            if isinstance(rec, CollectiveCall):
                recs += [(r.seq + 1, r) for r in (o.last_entered, o.last_completed)
                         if r is not None and r.seq is not None]
            else:
                recs += [(r.seq, r) for r in o.flight_recorder or [] if r.seq is not None]
            theirs.update({_key(r) for n, r in recs if n == seq})
        if theirs:
            (op, shape), n = theirs.most_common(1)[0]
            if (op, shape) != _key(rec) and n >= (len(snaps) - 1) / 2:
                return (f"issued {rec.op} {_key(rec)[1]} as collective #{seq} where {n} peer(s) issued "
                        f"{op} {shape}")
    return None


def _down(s: HangSnapshot) -> set[str]:
    """Interfaces down on this rank (compared with the peers': an interface down everywhere, an unused
    ifb or bridge, says nothing about one rank)."""
    return {n for n, v in s.nics.items() if n != "lo" and v.operstate == "down"}


def _ranks_to_state(world: int, by: dict[int, HangSnapshot], views: list[dict[str, PeerView]]) -> list[int]:
    """Every rank with a snapshot, and the silent ones: all of them when they are few (a culprit is
    often the one rank that wrote nothing); when most of a big job has not written yet, those a peer's
    view says something of, and the first SILENT_LISTED. Never one object per rank of a 10^6 world."""
    missing = world - len(by)
    if missing <= SILENT_LISTED:
        return list(range(world))
    spoken = {int(k) for v in views for k in v if k.isdigit() and int(k) < world and int(k) not in by}
    first: list[int] = []
    r = 0
    while len(first) < SILENT_LISTED and r < world:
        if r not in by:
            first.append(r)
        r += 1
    return sorted({*by, *spoken, *first})


def _dropped_on(host: str | None, addrs: set[str], snaps: list[HangSnapshot]) -> tuple[HangSnapshot, str] | None:
    """A rank on another host whose collective failed on a dropped connection to one of `addrs` (gloo
    names the peer: `Read error [10.0.0.4]:14541: Connection reset by peer`), and that address. A
    rank's own host is left out: its local peers drop their connections as they exit after an error."""
    for o in snaps:
        err = o.error or ""
        if o.host != host and LOST_PEER.search(err):
            for a in sorted(addrs):
                if f"[{a}]" in err:
                    return o, a
    return None


def _unreported(r: int, views: list[dict[str, PeerView]], snaps: list[HangSnapshot],
                alive_beats: bool) -> HangRankState:
    """A rank that wrote no snapshot, as its peers' views of the store say."""
    seen = [v[str(r)] for v in views if str(r) in v]
    gone = [v for v in seen if v.process_alive is False]
    ages = [v.heartbeat_age_seconds for v in seen if v.heartbeat_age_seconds is not None]
    host = next((v.host for v in seen if v.host), None)
    if gone:
        return HangRankState(rank=r, state="dead", host=host, detail=f"its process (pid {gone[0].pid}) is gone from "
                             f"{gone[0].host}; it wrote no snapshot")
    if ages and min(ages) > GONE_SECONDS and alive_beats:
        return HangRankState(rank=r, state="gone", host=host, detail=f"its heartbeat stopped {min(ages):.0f} s ago on "
                             f"{host or 'its host'} while the others' kept coming: its process died or its host is "
                             "cut off")
    if dropped := _dropped_on(host, {a for v in seen for a in v.addrs}, snaps):
        o, addr = dropped
        return HangRankState(rank=r, state="dropped", host=host, detail=f"no snapshot, and rank {o.rank}'s connection "
                             f"to its host ({addr}) dropped: {(o.error or '')[:160]}")
    return HangRankState(rank=r, state="silent", host=host, detail="no snapshot" + (
        f"; its last heartbeat was {min(ages):.0f} s old" if ages else "; no heartbeat in the store"))


def _stands(s: HangSnapshot, snaps: list[HangSnapshot], mode: int | None, majority: str | None,
            current: str) -> tuple[State, str]:
    """Where a rank that wrote a snapshot stands beside the others, and why it is said so."""
    down = [n for n in _down(s) if sum(n in _down(o) for o in snaps if o is not s) < (len(snaps) - 1) / 2]
    err = f"{FAILED}{s.error[:200]}" if s.error else ""
    if s.native:
        return "before_collective", native_detail(s)
    if down:
        return "link_down", f"interface {', '.join(down)} is down{err}"
    if (mis := _mismatch(s, snaps)) is not None:
        return "different_collective", mis + err
    if mode is not None and s.seq is not None and s.seq < mode:
        return "before_collective", f"collective #{s.seq} done, most ranks are at #{mode}{err}"
    if mode is not None and s.seq is not None and s.seq > mode:
        return "different_collective", (f"{RAN_AHEAD} to collective #{s.seq} (most ranks are at #{mode}): it "
                                        f"skipped one they called{err}")
    if majority is not None and current != majority:
        return "different_collective", f"stands in {current}; the others in {majority}{err}"
    if s.error:
        return "errored", s.error[:300]
    return "waiting_in_collective", ""


def states(snaps: list[HangSnapshot]) -> list[HangRankState]:
    world = max((s.world_size for s in snaps), default=0)
    by = {s.rank: s for s in snaps}
    out: list[HangRankState] = []
    views = [s.peers for s in snaps]
    seqs = Counter(s.seq for s in snaps if s.seq is not None)
    mode = max(seqs, key=lambda k: (seqs[k], k)) if seqs else None     # where most ranks stand
    at_mode = [s for s in snaps if s.seq == mode]
    current = {id(s): _current(s) for s in snaps}                  # where each rank stands, once
    majority = Counter(current[id(s)] for s in at_mode).most_common(1)[0][0] if at_mode else None
    # the store works: some peer's heartbeat is fresh (the watchdogs of hung but living ranks keep beating)
    alive_beats = any(v.heartbeat_age_seconds is not None and v.heartbeat_age_seconds < GONE_SECONDS / 2
                      for view in views for v in view.values())
    for r in _ranks_to_state(world, by, views):
        s = by.get(r)
        if s is None:
            out.append(_unreported(r, views, snaps, alive_beats))
            continue
        where = user_frame(s.stack)
        lock = bool(where and ("lock" in where.code.lower() or "acquire" in where.code.lower()))
        state, detail = _stands(s, snaps, mode, majority, current[id(s)])
        out.append(HangRankState(rank=r, state=state, detail=detail, last_step=s.last_step, seq=s.seq, where=where,
                                 in_data_loader=any("/torch/utils/data/" in f.file for f in s.stack),
                                 waits_on_lock=lock, collective=current[id(s)], host=s.host,
                                 native_frames=s.native_frames if s.native else []))
    errors = [s.error for s in snaps if s.error]
    vanished = (any(LOST_PEER.search(e) for e in errors) and not any(WRONG_SIZE.search(e) for e in errors)
                and any(s.state in ("silent", "dropped") for s in out))
    return _ahead_of_a_lost_rank(out, majority, vanished)


def _ahead_of_a_lost_rank(st: list[HangRankState], majority: str | None, vanished: bool = False) -> list[HangRankState]:
    """With a rank lost, a rank a collective or two ahead of the others in the same collective did
    not skip one: a ring all-reduce finishes on some ranks before others get their last chunk, so
    when a peer vanishes mid-ring, the ranks it already served go on to the next bucket's
    all-reduce and wait (or fail) there. It waits, like the others; the count is kept as detail.
    Lost: dead, gone or dropped, or (`vanished`) silent while the others' collectives failed on a
    dropped connection and none received a wrong size (the mark a real skipped collective leaves on
    gloo). A rank a collective behind in the same collective waits for the lost rank's chunk."""
    if not (vanished or any(s.state in ("dead", "gone", "dropped") for s in st)):
        return st

    def rewritten(s: HangRankState) -> HangRankState:
        if s.collective != majority:
            return s
        if s.state == "different_collective" and s.detail.startswith(RAN_AHEAD):
            why = " in the same collective, after its peers lost a rank mid-ring"   # served before the peer vanished
        elif s.state == "before_collective" and not s.in_data_loader and not s.waits_on_lock:
            why = " in the same collective: it waits for the lost rank's chunk"     # the mirror image: behind
        else:
            return s
        where, _, err = s.detail.partition(FAILED)
        return s.model_copy(update={"state": "errored" if err else "waiting_in_collective",
                                    "detail": where.split(": it skipped")[0] + why + (FAILED + err if err else "")})
    return [rewritten(s) for s in st]
