"""Each rank's heartbeat in the job's store (`eroica/hang/hb/<rank>`: step, time, pid, host and the
host's addresses, which a peer's "connection reset by [address]" names), and what
a stalled rank reads of its peers': a bounded sample (rank 0, its nearest ranks, an even spread),
fetched a chunk at a time (one `check` and one `multi_get`), so a stall in a 10,000-rank job costs
rank 0's store a few round trips per look from each stalled rank, not 10,000."""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from typing import Any

HB_KEY = "eroica/hang/hb/{rank}"
PEERS_MAX = 64
PEER_CHUNK = 16
ADDRS_MAX = 8
IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def host_addresses() -> list[str]:
    """This host's IP addresses (its network namespace), the collectives' interfaces first (as
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name them), loopback left out; at most ADDRS_MAX."""
    try:
        import psutil

        chosen = [n for env in IFNAME_ENVS for n in os.environ.get(env, "").lstrip("^=").split(",") if n]
        nics = psutil.net_if_addrs()
        names = [n for n in chosen if n in nics] + sorted(n for n in nics if n not in chosen)
        out = [a.address.split("%")[0] for n in names for a in nics[n]
               if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1"))]
        return list(dict.fromkeys(out))[:ADDRS_MAX]
    except Exception:
        return []


def peer_sample(rank: int, world: int, most: int = PEERS_MAX) -> list[int]:
    """The peers a stalled rank looks at: all of a small job's; in a big one, rank 0, its nearest
    ranks (its host's and its pipeline neighbours, in the usual placement) and an even spread."""
    if world <= most + 1:
        return [r for r in range(world) if r != rank]
    near = [rank + d for k in range(1, most // 4 + 1) for d in (-k, k) if 0 <= rank + d < world]
    picked = dict.fromkeys(r for r in [0, *near] if r != rank)
    stride = max(1, world // max(1, most - len(picked)))
    for r in itertools.chain(range(rank % stride, world, stride), range(world)):    # the spread, then any
        if len(picked) >= most:
            break
        if r != rank:
            picked.setdefault(r)
    return sorted(picked)[:most]


def _chunks(xs: list[int], n: int) -> list[list[int]]:
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def read_heartbeats(store: Any, ranks: list[int]) -> dict[int, Any]:
    """The heartbeats of `ranks`: one `check` and one `multi_get` when all exist; else the ranks are
    halved until the missing ones (a rank that never started has none) are found, a few round trips
    per missing rank. Errors are data, never raised."""
    keys = [HB_KEY.format(rank=r) for r in ranks]
    try:
        if store.check(keys):
            values = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
            return {r: json.loads(v) for r, v in zip(ranks, values)}
    except Exception as exc:
        return {r: {"error": repr(exc)[:200]} for r in ranks}
    if len(ranks) == 1:
        return {ranks[0]: {"heartbeat": None}}
    half = len(ranks) // 2
    return {**read_heartbeats(store, ranks[:half]), **read_heartbeats(store, ranks[half:])}


def peers_view(store: Any, rank: int, world: int) -> dict[str, dict[str, Any]]:
    """Each sampled peer as `rank` sees it through the store: its last step, heartbeat age, and, on
    this host, whether its process still exists."""
    out: dict[str, dict[str, Any]] = {}
    me = socket.gethostname()
    for chunk in _chunks(peer_sample(rank, world), PEER_CHUNK):
        for r, hb in read_heartbeats(store, chunk).items():
            if not isinstance(hb, dict) or "error" in hb or "wall_time" not in hb:
                out[str(r)] = hb if isinstance(hb, dict) and "error" in hb else {"heartbeat": None}
                continue
            alive = None
            if hb.get("host") == me and hb.get("pid"):
                try:
                    os.kill(int(hb["pid"]), 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except OSError:
                    alive = True
            out[str(r)] = {"step": hb.get("step"), "seq": hb.get("seq"),
                           "heartbeat_age_seconds": round(time.time() - hb["wall_time"], 1), "host": hb.get("host"),
                           "pid": hb.get("pid"), "process_alive": alive,
                           "addrs": [str(a)[:64] for a in hb.get("addrs") or []][:ADDRS_MAX]}
    return out
