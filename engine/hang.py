"""A hang's verdict from the ranks' watchdog snapshots (eroica.collector.hang): where each rank stands
beside its peers (eroica.engine.hang_states), the rules that read those states (knowledge/rules/hang/
and a site's, compiled once with the windows' knowledge), the taxonomy's `hang` section (precedence
and fallback), and how sure the verdict can be:

- *suspected* (no step for 20 s at the default policy): the deciding rule's prior x a pause factor
  that follows how far the stall exceeds the job's own longest healthy pause so far (its longest
  step: a checkpoint, an evaluation pass). A 20 s stall in a job whose longest pause was 2 s stands
  as a finding; in a job that checkpoints for a minute it stays a low suspicion until it outlasts it;
- *confirmed* (at the policy's limit, or a collective that failed): the prior alone;
- *resolved*: the job stepped again; the verdict says how long the stall lasted.

Everything here works on typed documents (eroica.schema.hang): the snapshots a run directory holds
(and faulthandler's dumps, turned into ones), or those the service stored."""

from __future__ import annotations

import json
import linecache
import re
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from eroica.engine.facts import HangState
from eroica.engine.hang_states import states
from eroica.engine.rules.conclusion import Conclusion
from eroica.engine.rules.ir import RuleIR
from eroica.engine.rules.runner import run_rules
from eroica.engine.taxonomy import TaxonomyEntry, load_hang_resolution, load_taxonomy
from eroica.schema.hang import (
    NATIVE_HEADER,
    Category,
    HangFinding,
    HangRankState,
    HangSnapshot,
    HangStage,
)

CLUSTER_SECONDS = 180.0
PAUSE_FLOOR = 0.3         # a suspicion no longer than a pause the job has made before: this much of the prior


def _read(path: Path) -> HangSnapshot | None:
    try:
        return HangSnapshot.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None                       # a rank is still writing it, or it is not a snapshot


def load_snapshots(run_dir: Path) -> list[HangSnapshot]:
    """The latest hang's snapshots in a run directory (see `latest`): the watchdogs' own, and, for a
    rank whose watchdog could not run (its training thread held the GIL in C code), faulthandler's
    dump turned into one, with the C frames a peer on its host read with py-spy."""
    snaps = [s for f in sorted(Path(run_dir).glob("hang-s*/rank-*.hang.json")) if (s := _read(f)) is not None]
    own = {s.rank for s in latest(snaps)}
    read = {s.rank: s for f in sorted(Path(run_dir).glob("hang-native/rank-*.pyspy.json"))
            if (s := _read(f)) is not None}
    for f in sorted(Path(run_dir).glob("hang-native/rank-*.txt")):
        n = native_snapshot(f)
        if n is not None and n.rank not in own:
            peer = read.pop(n.rank, None)
            if peer is not None:          # faulthandler's Python frames, with the C frames the peer read
                n = n.model_copy(update={"read_by_rank": peer.read_by_rank, "owns_gil": peer.owns_gil,
                                         "native_frames": peer.native_frames, "native_gap": peer.native_gap})
            snaps.append(n)
    snaps += [doc for r, doc in read.items() if r not in own]
    return latest(snaps)


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def native_header(path: Path) -> dict | None:  # type: ignore[type-arg]
    """The JSON header the watchdog keeps at the head of its dead man's switch's file; None if unreadable."""
    try:
        with path.open("rb") as f:
            head = json.loads(f.read(NATIVE_HEADER))
        return head if isinstance(head, dict) and "rank" in head else None
    except (OSError, ValueError):
        return None


def native_snapshot(path: Path) -> HangSnapshot | None:
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
    try:
        stack = threads.get(int(head["thread"], 16), [])
        stalled = max(0.0, dumped_at - float(head["last_step_wall_time"]))
        limit = float(head["limit_seconds"])
        return HangSnapshot.model_validate({
            "schema": "eroica.hang/v1", "job": head.get("job", ""), "rank": head["rank"],
            "world_size": head["world_size"], "host": head.get("host"), "pid": head.get("pid"),
            "wall_time": dumped_at, "last_step": head.get("last_step") or 0, "stalled_seconds": round(stalled, 2),
            "limit_seconds": limit, "state": "confirmed" if stalled > limit else "suspected",
            "suspect_after_seconds": head.get("suspect_after_seconds"),
            "longest_pause_seconds": head.get("longest_pause_seconds"),
            "longest_pause_step": head.get("longest_pause_step"),
            "median_step_seconds": head.get("median_step_seconds"),
            "stack": stack, "stack_gap": None if stack else "the training thread is not in faulthandler's dump",
            "native": True, "faulthandler": True})
    except (KeyError, TypeError, ValueError):
        return None


def began(s: HangSnapshot) -> float:
    """When the rank's stall began: its last step's wall time."""
    return s.wall_time - s.stalled_seconds


def latest(snaps: Sequence[HangSnapshot]) -> list[HangSnapshot]:
    """Every rank's newest snapshot of the newest stall: those whose stall began within CLUSTER_SECONDS
    of the latest stall's beginning (a rank confirming a hang 300 s after the others suspected it is
    the same hang). A rank's resolution that came before the newest stall began belongs to an earlier
    pause: left out."""
    if not snaps:
        return []
    newest = max(began(s) for s in snaps)
    last: dict[int, HangSnapshot] = {}
    for s in sorted(snaps, key=lambda s: s.wall_time):
        if began(s) >= newest - CLUSTER_SECONDS:
            last[s.rank] = s
    start = max((began(s) for s in last.values() if s.state != "resolved"), default=None)
    return [last[r] for r in sorted(last) if start is None or last[r].state != "resolved"
            or (last[r].resolved_wall_time or 0.0) >= start]


def stage(snaps: Sequence[HangSnapshot]) -> HangStage:
    """The hang's stage from its ranks' records: confirmed when a rank confirmed it (or its collective
    failed: no pause comes back from that), resolved when a rank stepped again, else suspected."""
    if any(s.error or s.state == "confirmed" for s in snaps):
        return "confirmed"
    return "resolved" if any(s.state == "resolved" for s in snaps) else "suspected"


def pause_factor(hang_stage: HangStage, stalled_seconds: float, longest_pause_seconds: float | None) -> float:
    """How far a stall exceeds the job's longest healthy pause so far, as a factor of the prior: 1 once
    confirmed, or at twice that pause; PAUSE_FLOOR up to the pause itself; linear in between."""
    if hang_stage == "confirmed" or not longest_pause_seconds:
        return 1.0
    return round(min(1.0, max(PAUSE_FLOOR, stalled_seconds / longest_pause_seconds - 1.0)), 3)


def localize(run_dir: Path) -> HangFinding | None:
    return localize_snapshots(load_snapshots(run_dir))


def localize_documents(snaps: Sequence[HangSnapshot | dict], rules: Sequence[RuleIR] | None = None,  # type: ignore[type-arg]
                       taxonomy: dict[str, TaxonomyEntry] | None = None) -> HangFinding | None:
    """The verdict on a hang's snapshots as documents (typed, or as stored: validated here); the
    latest hang among them. `rules`, `taxonomy`: the knowledge the windows were diagnosed with (a
    site's rules, overrides and root causes, which rank after the shipped `hang` precedence); the
    shipped ones when not given."""
    typed = [s if isinstance(s, HangSnapshot) else HangSnapshot.model_validate(s) for s in snaps]
    return localize_snapshots(latest(typed), rules, taxonomy)


def localize_snapshots(snaps: list[HangSnapshot], rules: Sequence[RuleIR] | None = None,
                       taxonomy: dict[str, TaxonomyEntry] | None = None) -> HangFinding | None:
    """The verdict on one hang's snapshots (a run directory's, or those the service received): the
    rules conclude on the ranks' states, the taxonomy's `hang` section picks one cause (its precedence)
    or says what no rule concluded (its fallback), and names the cause's category."""
    if not snaps:
        return None
    taxonomy = taxonomy if taxonomy is not None else load_taxonomy()
    resolution = load_hang_resolution()
    st = states(snaps)
    hang_stage = stage(snaps)
    resolved = [s.resolved_after_seconds for s in snaps if s.resolved_after_seconds is not None]
    stalled = max(resolved) if hang_stage == "resolved" and resolved else max(s.stalled_seconds for s in snaps)
    pauses = [(s.longest_pause_seconds, s.longest_pause_step) for s in snaps if s.longest_pause_seconds is not None]
    longest, longest_step = max(pauses, key=lambda p: p[0]) if pauses else (None, None)
    factor = pause_factor(hang_stage, stalled, longest)
    first = min((s for s in snaps if s.suspected_because), key=lambda s: s.wall_time, default=None)
    because = first.suspected_because if first is not None else None
    ev = [f"rank {s.rank}: {s.state.replace('_', ' ')}" + (f", in {s.collective}" if s.collective else "")
          + (f" ({s.detail})" if s.detail else "") for s in st]

    def finding(cause: str, culprits: list[HangRankState], prior: float, summary: str,
                rule_id: str | None) -> HangFinding:
        hosts = sorted({c.host for c in culprits if c.host})
        others = {s.host for s in st if s.host and s.rank not in {c.rank for c in culprits}}
        if len(hosts) == 1 and hosts[0] not in others and len({s.host for s in st if s.host}) > 1:
            summary = f"host {hosts[0]}: {summary}"      # every rank of that host, and no other: the host's
        entry = taxonomy.get(cause)
        cat: Category = "hardware" if entry is not None and entry.category == "hardware" else "software"
        return HangFinding(
            root_cause=cause, category=cat, ranks=[c.rank for c in culprits],
            where=culprits[0].where if culprits else None, confidence=round(prior * factor, 4), summary=summary,
            evidence=ev, stalled_seconds=stalled, limit_seconds=max(s.limit_seconds for s in snaps), states=st,
            hosts=hosts, state=hang_stage, rule_id=rule_id, prior_confidence=prior, pause_factor=factor,
            suspect_after_seconds=max((s.suspect_after_seconds for s in snaps if s.suspect_after_seconds is not None),
                                      default=None),
            longest_pause_seconds=longest, longest_pause_step=longest_step,
            resolved_after_seconds=max(resolved) if hang_stage == "resolved" and resolved else None,
            last_step=min(s.last_step for s in snaps), stalled_since=min(began(s) for s in snaps),
            suspected_because=because)
    best = _conclusions(st, _rules() if rules is None else tuple(rules))
    if not best:
        return finding(resolution.fallback_cause, [], resolution.fallback_confidence, resolution.fallback_summary, None)
    cause = min(best, key=lambda c: (resolution.rank(c), -max(x.rule_confidence for x in best[c])))
    state = {s.rank: s for s in st}
    cs = best[cause]
    # a silent rank is named only when no rank's loss is better evidenced (its process gone, its
    # heartbeat stopped, its host's connection dropped): the others went quiet after the fact
    cs = [c for c in cs if state[c.rank].state != "silent"] or cs
    top = max(cs, key=lambda c: c.rule_confidence)
    return finding(cause, [state[c.rank] for c in cs], top.rule_confidence, " ".join(cs[0].summary.split()),
                   top.rule_id)


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


def waiting(run_dir: Path, now: float | None = None) -> str | None:
    """What a run directory without a hang snapshot says of its ranks, from the headers their watchdogs
    keep in `hang-native/` (each rewritten at every poll while the rank lives): None when there are none."""
    heads = [h for f in sorted(Path(run_dir).glob("hang-native/rank-*.txt")) if (h := native_header(f)) is not None]
    if not heads:
        return None
    now = time.time() if now is None else now
    try:
        last = min(heads, key=lambda h: float(h["last_step_wall_time"]))
        since = now - float(last["last_step_wall_time"])
        step, world = int(last["last_step"]), int(last["world_size"])
        suspect = float(last.get("suspect_after_seconds") or last["limit_seconds"])
        confirm = float(last["limit_seconds"])
    except (KeyError, TypeError, ValueError):
        return None
    ranks = f"{len(heads)} of {world} rank(s) keep a watchdog header"
    if since <= suspect:
        return (f"{ranks}; the slowest stepped {since:.0f} s ago (step {step}); a hang is suspected after "
                f"{suspect:.0f} s without a step and confirmed after {confirm:.0f} s")
    return (f"{ranks}; no rank has stepped since step {step} ({since:.0f} s ago); no snapshot yet: the limit is "
            f"{suspect:.0f} s from the last step (confirmed at {confirm:.0f} s). A watchdog that has not written "
            "by then ran no Python (its dead man's switch writes hang-native/) or its process is gone")


def liveness(run_dir: Path, f: HangFinding, now: float | None = None) -> str | None:
    """What a run directory says now of a hang that has not resolved: how long since the ranks' last
    step, and whether their watchdogs still run (their headers in `hang-native/` are rewritten at every
    poll while the process lives): a job killed after its snapshots keeps its last verdict, which this
    line dates. None for a resolved hang or without a beginning."""
    if f.state == "resolved" or f.stalled_since is None:
        return None
    now = time.time() if now is None else now
    line = f"now: no step for {now - f.stalled_since:.0f} s (since step {f.last_step})"
    written = []
    for h in Path(run_dir).glob("hang-native/rank-*.txt"):
        try:
            written.append(h.stat().st_mtime)
        except OSError:
            continue
    if written:
        age = now - max(written)
        line += (f"; the ranks' watchdogs still run (their headers were written {age:.0f} s ago)" if age < 30 else
                 f"; no watchdog has written for {age:.0f} s: the job's processes are gone (killed or ended), and "
                 "this verdict is what they saw last")
    return line


def confidence_line(f: HangFinding) -> str:
    by = f"decided by {f.rule_id}" if f.rule_id else "no hang rule concluded: the taxonomy's fallback"
    return f"confidence: prior {f.prior_confidence:.2f} x pause {f.pause_factor:.2f} = {f.confidence:.2f}; {by}"


def _headline(f: HangFinding) -> str:
    pause = (f"the job's longest healthy pause so far was {f.longest_pause_seconds:.1f} s"
             + (f" (step {f.longest_pause_step})" if f.longest_pause_step is not None else "")
             if f.longest_pause_seconds is not None else "")
    because = f.suspected_because or f"suspected after {f.suspect_after_seconds or f.limit_seconds:.0f} s"
    why = f"suspected: {because}" if f.suspected_because else because
    if f.state == "resolved":
        return (f"Resolved: the job stepped again after {f.stalled_seconds:.0f} s without a step ({why})"
                f"{'; ' + pause if pause else ''}. While it waited: {f.summary}")
    if f.state == "suspected":
        return (f"Suspected: no step for {f.stalled_seconds:.0f} s when the snapshots were taken ({because}; "
                f"confirmed at {f.limit_seconds:.0f} s){'; ' + pause if pause else ''}. {f.summary}")
    first = f"; first {why}" if f.suspected_because else ""
    return f"No step for {f.stalled_seconds:.0f} s (the limit was {f.limit_seconds:.0f} s{first}). {f.summary}"


def render(f: HangFinding, fmt: str = "text") -> str:
    """The hang verdict: JSON (the model), or a short report for people (text and Markdown alike)."""
    if fmt == "json":
        return f.model_dump_json(indent=2) + "\n"
    lines = [f"# Hang: {f.root_cause} on rank {', '.join(map(str, f.ranks)) or '?'} "
             f"({f.category}, {f.state}, confidence {f.confidence:.2f})", "", _headline(f), "", confidence_line(f), ""]
    if f.where is not None:
        lines += [f"Where: `{f.where.function}` at {f.where.file}:{f.where.line}", f"    {f.where.code}", ""]
    lines += ["| rank | state | step | seq | stands in | where |", "|---|---|---|---|---|---|"]
    lines += [f"| {s.rank} | {s.state.replace('_', ' ')} | {s.last_step if s.last_step is not None else '-'} | "
              f"{s.seq if s.seq is not None else '-'} | {s.collective or '-'} | {s.where or s.detail or '-'} |"
              for s in f.states]
    return "\n".join(lines) + "\n"
