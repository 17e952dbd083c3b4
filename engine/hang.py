"""Localizing a hang from the ranks' watchdog snapshots (eroica.collector.hang): peer comparison on
where each rank's training thread stands and on the default group's collective sequence number.

- a rank whose sequence number is behind never reached the collective the others wait in: it is
  stuck before it (data loading, a lock, I/O, a loop), and its stack says where;
- ranks at the same number that stand in different collectives (one inside `backward`'s all-reduce,
  the others in an explicit `all_reduce`), or in the same one with other shapes, are desynchronized:
  the minority is the culprit;
- a rank that wrote nothing and whose process is gone (a peer on its host checked its pid), or whose
  peers' collectives failed with a dropped connection, died;
- all ranks in the same collective with one rank's link down: the link.

Each rank becomes a typed `HangRankState`; the verdict is a `HangFinding` with the kind, the
culprit ranks, the location (function, file, line) and the evidence an SRE can check."""

from __future__ import annotations

import json
import linecache
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from eroica.engine.facts import HangState
from eroica.engine.rules.conclusion import Conclusion
from eroica.engine.rules.ir import RuleIR
from eroica.engine.rules.runner import run_rules
from eroica.engine.taxonomy import TaxonomyEntry, load_hang_resolution, load_taxonomy
from eroica.schema.hang import (
    NATIVE_HEADER,
    Category,
    HangFinding,
    HangFrame,
    HangRankState,
    HangSnapshot,
)

LIBRARY = ("/torch/", "/eroica/", "/threading.py", "/queue.py", "/selectors.py", "/socket.py", "/contextlib.py",
           "/multiprocessing/", "/site-packages/", "/lib/python3", "<frozen")
CLUSTER_SECONDS = 180.0


def load_snapshots(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    """The latest hang's snapshots in a run directory (see `latest`): the watchdogs' own, and, for a
    rank whose watchdog could not run (its training thread held the GIL in C code), faulthandler's
    dump turned into one."""
    snaps = []
    for f in sorted(Path(run_dir).glob("hang-s*/rank-*.hang.json")):
        try:
            snaps.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    own = {s["rank"] for s in latest(snaps)}
    # a peer's py-spy reading of a rank that ran no Python (eroica.collector.native_stack)
    read: dict[int, dict] = {}  # type: ignore[type-arg]
    for f in sorted(Path(run_dir).glob("hang-native/rank-*.pyspy.json")):
        try:
            doc = json.loads(f.read_text())
            read[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError, TypeError):
            continue                      # a peer is still writing it
    for f in sorted(Path(run_dir).glob("hang-native/rank-*.txt")):
        n = native_snapshot(f)
        if n is not None and n["rank"] not in own:
            # faulthandler's Python frames, with the C frames the peer read
            peer = read.pop(n["rank"], {})
            snaps.append({**n, **{k: peer[k] for k in ("read_by_rank", "owns_gil", "native_frames", "native_gap")
                                  if k in peer}})
    snaps += [doc for r, doc in read.items() if r not in own]
    return latest(snaps)


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def native_snapshot(path: Path) -> dict | None:  # type: ignore[type-arg]
    """A faulthandler dump written by the watchdog's dead man's switch (eroica.collector.hang), as a
    snapshot: the training thread's frames, innermost first, and no collective state (the process
    could run no Python to read it). None when the switch never fired."""
    try:
        raw = path.read_bytes()
        if len(raw) <= NATIVE_HEADER:
            return None
        head = json.loads(raw[:NATIVE_HEADER])
        dumped_at = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    threads: dict[int, list[dict]] = {}  # type: ignore[type-arg]
    cur: list[dict] | None = None  # type: ignore[type-arg]
    for line in raw[NATIVE_HEADER:].decode(errors="replace").splitlines():
        if m := _THREAD.match(line):
            cur = threads.setdefault(int(m.group(1), 16), [])
        elif (m := _FRAME.match(line)) and cur is not None:
            file, no = m.group(1), int(m.group(2))
            cur.append({"file": file, "line": no, "function": m.group(3).strip(),
                        "code": linecache.getline(file, no).strip()[:160]})
    stack = threads.get(int(head["thread"], 16), [])
    return {"schema": "eroica.hang/v1", "job": head.get("job", ""), "rank": head["rank"],
            "world_size": head["world_size"], "host": head.get("host"), "pid": head.get("pid"),
            "wall_time": dumped_at, "last_step": head.get("last_step"),
            "stalled_seconds": round(dumped_at - head["last_step_wall_time"], 2),
            "limit_seconds": head["limit_seconds"],
            "stack": stack, "stack_gap": None if stack else "the training thread is not in faulthandler's dump",
            "seq": None, "last_entered": None, "last_completed": None, "error": None, "nics": {}, "peers": {},
            "native": True, "faulthandler": True}


def _native_detail(s: dict) -> str:  # type: ignore[type-arg]
    """What is known of a rank that ran no Python: faulthandler's dump, a peer's py-spy reading, or both."""
    frames = s.get("native_frames") or []
    source = "faulthandler's dump" if s.get("faulthandler") else f"rank {s.get('read_by_rank')}'s py-spy reading"
    gil = "holds the GIL" if s.get("owns_gil") is not False else "is stuck"
    text = (f"its training thread {gil} inside native code, so its watchdog could not run: the stack is {source}, "
            f"{s['stalled_seconds']:.0f} s after its last step (step {s['last_step']})")
    if frames:
        text += f"; in C: {' <- '.join(frames[:4])} (py-spy, read by rank {s.get('read_by_rank')} on its host)"
    elif s.get("native_gap"):
        text += f"; its C frames: {s['native_gap']}"
    return text


def latest(snaps: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """Every rank's newest snapshot within CLUSTER_SECONDS of the newest of all: one hang."""
    if not snaps:
        return []
    newest = max(s["wall_time"] for s in snaps)
    last: dict[int, dict] = {}  # type: ignore[type-arg]
    for s in sorted(snaps, key=lambda s: s["wall_time"]):
        if s["wall_time"] >= newest - CLUSTER_SECONDS:
            last[s["rank"]] = s
    return [last[r] for r in sorted(last)]


def _user_frame(stack: list[dict]) -> HangFrame | None:  # type: ignore[type-arg]
    for f in stack:
        if not any(m in f["file"] for m in LIBRARY):
            return HangFrame(**f)
    return HangFrame(**stack[0]) if stack else None


def _current(s: dict) -> str:  # type: ignore[type-arg]
    """The collective the rank stands in: an explicit one still open, else where its thread waits."""
    ent, done = s.get("last_entered"), s.get("last_completed")
    if ent and ent != done:
        return f"{ent['op']} {ent.get('shape')} at {Path(ent['file']).name}:{ent['line']}"
    stack = s.get("stack") or []
    if any("/torch/autograd/" in f["file"] for f in stack):
        return "backward (DDP's gradient all-reduce)"
    u = _user_frame(stack)
    return f"{u.function} at {Path(u.file).name}:{u.line}" if u else "unknown"


def _mismatch(s: dict, snaps: list[dict]) -> str | None:  # type: ignore[type-arg]
    """The collective this rank issued where its peers issued another operation or shape at the same
    sequence number: from the collector's wrappers (an explicit collective still open) or from torch's
    Flight Recorder (any collective, DDP's own included). The peers may have completed theirs and
    gone on (gloo completes the smaller side), so what they entered and completed both count."""
    def key(rec: dict) -> tuple[str, str]:  # type: ignore[type-arg]
        return str(rec.get("op")), str(rec.get("shape", rec.get("sizes")))

    mine: list[tuple[int, dict]] = []  # type: ignore[type-arg]
    ent, done = s.get("last_entered"), s.get("last_completed")
    if ent and ent != done and ent.get("seq") is not None:
        mine.append((ent["seq"] + 1, ent))                # the wrapper records the number before the call
    fr = s.get("flight_recorder") or []
    if fr and fr[-1].get("seq") is not None:
        mine.append((fr[-1]["seq"], fr[-1]))
    for seq, rec in mine:
        theirs: Counter[tuple[str, str]] = Counter()
        for o in snaps:
            if o is s:
                continue
            recs = [(r["seq"] + 1, r) for r in (o.get("last_entered"), o.get("last_completed"))
                    if r and r.get("seq") is not None and "shape" in rec]
            recs += [(r["seq"], r) for r in o.get("flight_recorder") or [] if "sizes" in rec]
            got = {key(r) for n, r in recs if n == seq}
            theirs.update(got)
        if theirs:
            (op, shape), n = theirs.most_common(1)[0]
            if (op, shape) != key(rec) and n >= (len(snaps) - 1) / 2:
                return (f"issued {rec.get('op')} {key(rec)[1]} as collective #{seq} where {n} peer(s) issued "
                        f"{op} {shape}")
    return None


def _down(s: dict) -> set[str]:  # type: ignore[type-arg]
    """Interfaces down on this rank (compared with the peers': an interface down everywhere, an unused
    ifb or bridge, says nothing about one rank)."""
    return {n for n, v in (s.get("nics") or {}).items() if n != "lo" and v.get("operstate") == "down"}


GONE_SECONDS = 15.0       # a heartbeat (every 2 s from a living rank's watchdog) this old: the rank is gone
RAN_AHEAD = "ran ahead"
FAILED = "; then its collective failed: "
# a collective that failed because a peer's connection went away (gloo's words; NCCL's abort)
LOST_PEER = re.compile(r"(reset|closed) by peer|broken pipe|connection refused|remote process exited", re.I)
# what gloo says on the rank that received a skipped or reshaped collective's data
WRONG_SIZE = re.compile(r"size doesn't match|doesn't match expected", re.I)
SILENT_LISTED = 1024      # silent ranks stated one by one; past it, only those a peer said something of


def _ranks_to_state(world: int, by: dict[int, dict], views: list[dict]) -> list[int]:  # type: ignore[type-arg]
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


def _dropped_on(host: str | None, addrs: set[str], snaps: list[dict]) -> tuple[dict, str] | None:  # type: ignore[type-arg]
    """A rank on another host whose collective failed on a dropped connection to one of `addrs` (gloo
    names the peer: `Read error [10.0.0.4]:14541: Connection reset by peer`), and that address. A
    rank's own host is left out: its local peers drop their connections as they exit after an error."""
    for o in snaps:
        err = o.get("error") or ""
        if o.get("host") != host and LOST_PEER.search(err):
            for a in sorted(addrs):
                if f"[{a}]" in err:
                    return o, a
    return None


def states(snaps: list[dict]) -> list[HangRankState]:  # type: ignore[type-arg]
    world = max((s["world_size"] for s in snaps), default=0)
    by = {s["rank"]: s for s in snaps}
    out: list[HangRankState] = []
    views = [s.get("peers", {}) for s in snaps]
    seqs = Counter(s["seq"] for s in snaps if s.get("seq") is not None)
    mode = max(seqs, key=lambda k: (seqs[k], k)) if seqs else None     # where most ranks stand
    at_mode = [s for s in snaps if s.get("seq") == mode]
    current = {id(s): _current(s) for s in snaps}                  # where each rank stands, once
    majority = Counter(current[id(s)] for s in at_mode).most_common(1)[0][0] if at_mode else None
    # the store works: some peer's heartbeat is fresh (the watchdogs of hung but living ranks keep beating)
    alive_beats = any(v.get("heartbeat_age_seconds") is not None and v["heartbeat_age_seconds"] < GONE_SECONDS / 2
                      for view in views for v in view.values() if isinstance(v, dict))
    for r in _ranks_to_state(world, by, views):
        s = by.get(r)
        if s is None:
            seen = [v.get(str(r), {}) for v in views]
            gone = [v for v in seen if v.get("process_alive") is False]
            ages = [v["heartbeat_age_seconds"] for v in seen if v.get("heartbeat_age_seconds") is not None]
            host = next((v.get("host") for v in seen if v.get("host")), None)
            if gone:
                out.append(HangRankState(rank=r, state="dead", host=host, detail=f"its process (pid "
                                         f"{gone[0].get('pid')}) is gone from {gone[0].get('host')}; it wrote no "
                                         "snapshot"))
            elif ages and min(ages) > GONE_SECONDS and alive_beats:
                out.append(HangRankState(rank=r, state="gone", host=host, detail=f"its heartbeat stopped "
                                         f"{min(ages):.0f} s ago on {host or 'its host'} while the others' kept "
                                         "coming: its process died or its host is cut off"))
            elif dropped := _dropped_on(host, {a for v in seen for a in v.get("addrs") or []}, snaps):
                o, addr = dropped
                out.append(HangRankState(rank=r, state="dropped", host=host, detail=f"no snapshot, and rank "
                                         f"{o['rank']}'s connection to its host ({addr}) dropped: {o['error'][:160]}"))
            else:
                out.append(HangRankState(rank=r, state="silent", host=host, detail="no snapshot" + (
                    f"; its last heartbeat was {min(ages):.0f} s old" if ages else "; no heartbeat in the store")))
            continue
        stack = s.get("stack") or []
        where = _user_frame(stack)
        loader = any("/torch/utils/data/" in f["file"] for f in stack)
        lock = bool(where and ("lock" in where.code.lower() or "acquire" in where.code.lower()))
        common = dict(rank=r, last_step=s.get("last_step"), seq=s.get("seq"), where=where, in_data_loader=loader,
                      waits_on_lock=lock, collective=current[id(s)], host=s.get("host"))
        down = [n for n in _down(s) if sum(n in _down(o) for o in snaps if o is not s) < (len(snaps) - 1) / 2]
        err = f"{FAILED}{s['error'][:200]}" if s.get("error") else ""
        if s.get("native"):
            out.append(HangRankState(state="before_collective", detail=_native_detail(s),
                                     native_frames=s.get("native_frames") or [], **common))
        elif down:
            out.append(HangRankState(state="link_down", detail=f"interface {', '.join(down)} is down{err}", **common))
        elif (mis := _mismatch(s, snaps)) is not None:
            out.append(HangRankState(state="different_collective", detail=mis + err, **common))
        elif mode is not None and s.get("seq") is not None and s["seq"] < mode:
            out.append(HangRankState(state="before_collective", detail=f"collective #{s['seq']} done, most ranks "
                                     f"are at #{mode}{err}", **common))
        elif mode is not None and s.get("seq") is not None and s["seq"] > mode:
            out.append(HangRankState(state="different_collective", detail=f"{RAN_AHEAD} to collective #{s['seq']} "
                                     f"(most ranks are at #{mode}): it skipped one they called{err}", **common))
        elif majority is not None and current[id(s)] != majority:
            out.append(HangRankState(state="different_collective", detail=f"stands in {current[id(s)]}; the others in "
                                     f"{majority}{err}", **common))
        elif s.get("error"):
            out.append(HangRankState(state="errored", detail=s["error"][:300], **common))
        else:
            out.append(HangRankState(state="waiting_in_collective", **common))
    errors = [s["error"] for s in snaps if s.get("error")]
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


def localize(run_dir: Path) -> HangFinding | None:
    return localize_snapshots(load_snapshots(run_dir))


def localize_documents(snaps: Sequence[HangSnapshot | dict], rules: Sequence[RuleIR] | None = None,  # type: ignore[type-arg]
                       taxonomy: dict[str, TaxonomyEntry] | None = None) -> HangFinding | None:
    """The verdict on a hang's snapshots as documents: typed (eroica.schema.hang, as the service
    validated them) or as read from a run directory (with faulthandler's dumps turned into ones);
    the latest hang among them. `rules`, `taxonomy`: the knowledge the windows were diagnosed with
    (a site's rules, overrides and root causes); the shipped ones when not given."""
    return localize_snapshots(latest([s.model_dump(mode="json", by_alias=True) if isinstance(s, HangSnapshot) else s
                                      for s in snaps]), rules, taxonomy)


def localize_snapshots(snaps: list[dict], rules: Sequence[RuleIR] | None = None,  # type: ignore[type-arg]
                       taxonomy: dict[str, TaxonomyEntry] | None = None) -> HangFinding | None:
    """The verdict on one hang's snapshots (a run directory's, or those the service received): the
    rules conclude on the ranks' states, the taxonomy's `hang` section picks one cause (its precedence)
    or says what no rule concluded (its fallback), and names the cause's category."""
    if not snaps:
        return None
    taxonomy = taxonomy if taxonomy is not None else load_taxonomy()
    resolution = load_hang_resolution()
    st = states(snaps)
    stalled = max(s["stalled_seconds"] for s in snaps)
    limit = max(s["limit_seconds"] for s in snaps)
    ev = [f"rank {s.rank}: {s.state.replace('_', ' ')}" + (f", in {s.collective}" if s.collective else "")
          + (f" ({s.detail})" if s.detail else "") for s in st]

    def finding(cause: str, culprits: list[HangRankState], conf: float, summary: str) -> HangFinding:
        hosts = sorted({c.host for c in culprits if c.host})
        others = {s.host for s in st if s.host and s.rank not in {c.rank for c in culprits}}
        if len(hosts) == 1 and hosts[0] not in others and len({s.host for s in st if s.host}) > 1:
            summary = f"host {hosts[0]}: {summary}"      # every rank of that host, and no other: the host's
        entry = taxonomy.get(cause)
        cat: Category = "hardware" if entry is not None and entry.category == "hardware" else "software"
        return HangFinding(root_cause=cause, category=cat, ranks=[c.rank for c in culprits],
                           where=culprits[0].where if culprits else None, confidence=conf, summary=summary,
                           evidence=ev, stalled_seconds=stalled, limit_seconds=limit, states=st, hosts=hosts)
    best = _conclusions(st, _rules() if rules is None else tuple(rules))
    if not best:
        return finding(resolution.fallback_cause, [], resolution.fallback_confidence, resolution.fallback_summary)
    cause = min(best, key=lambda c: (resolution.rank(c), -max(x.rule_confidence for x in best[c])))
    state = {s.rank: s for s in st}
    cs = best[cause]
    # a silent rank is named only when no rank's loss is better evidenced (its process gone, its
    # heartbeat stopped, its host's connection dropped): the others went quiet after the fact
    cs = [c for c in cs if state[c.rank].state != "silent"] or cs
    culprits = [state[c.rank] for c in cs]
    return finding(cause, culprits, max(c.rule_confidence for c in cs), " ".join(cs[0].summary.split()))


def hang_facts(st: list[HangRankState]) -> list[HangState]:
    return [HangState(rank=s.rank, state=s.state, seq=s.seq if s.seq is not None else -1,
                      in_data_loader=s.in_data_loader, waits_on_lock=s.waits_on_lock,
                      function=s.where.function if s.where else "", file=s.where.file if s.where else "",
                      line=s.where.line if s.where else 0, code=s.where.code if s.where else "",
                      collective=s.collective or "", detail=s.detail) for s in st]


def _conclusions(st: list[HangRankState], rules: tuple[RuleIR, ...]) -> dict[str, list[Conclusion]]:
    """The rules that read the ranks' hang states (knowledge/rules/hang/, and a site's) on those
    states: each cause with its most confident conclusion per rank."""
    hang_rules = [r for r in rules if any(p.kind == HangState.model_fields["kind"].default for p in r.patterns)]
    if not hang_rules:
        return {}
    got = run_rules(hang_rules, {"hang": list(hang_facts(st))}, in_process=True).get("hang", ([], []))[0]
    by: dict[str, dict[int, Conclusion]] = {}
    for c in got:
        mine = by.setdefault(c.root_cause, {})
        if c.rank not in mine or c.rule_confidence > mine[c.rank].rule_confidence:
            mine[c.rank] = c
    return {k: [v[r] for r in sorted(v)] for k, v in by.items()}


def _rules() -> tuple[RuleIR, ...]:
    """The shipped rules, for a hang localized without a diagnosis' knowledge (compiled when one is seen)."""
    from eroica.engine.rules.layers import KnowledgeSpec, compiled_once

    return compiled_once(KnowledgeSpec())


def render(f: HangFinding, fmt: str = "text") -> str:
    """The hang verdict: JSON (the model), or a short report for people (text and Markdown alike)."""
    if fmt == "json":
        return f.model_dump_json(indent=2) + "\n"
    lines = [f"# Hang: {f.root_cause} on rank {', '.join(map(str, f.ranks)) or '?'} "
             f"({f.category}, confidence {f.confidence:.2f})", "",
             f"No step for {f.stalled_seconds:.0f} s (the limit was {f.limit_seconds:.0f} s). {f.summary}", ""]
    if f.where is not None:
        lines += [f"Where: `{f.where.function}` at {f.where.file}:{f.where.line}", f"    {f.where.code}", ""]
    lines += ["| rank | state | step | seq | stands in | where |", "|---|---|---|---|---|---|"]
    lines += [f"| {s.rank} | {s.state.replace('_', ' ')} | {s.last_step if s.last_step is not None else '-'} | "
              f"{s.seq if s.seq is not None else '-'} | {s.collective or '-'} | {s.where or s.detail or '-'} |"
              for s in f.states]
    return "\n".join(lines) + "\n"
