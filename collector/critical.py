"""Critical-path attribution by priority, on one rank's own clock.

Input: function executions as intervals (start, end, category, name). At every instant the
interval with the highest-priority category holds the critical path (ties: the one that started
first); instants covered by nothing belong to untracked Python. Output: segments
(start, end, key) that tile the window, from which beta (share of critical-path time) and
the per-function hardware metric are computed.

Timestamps are never compared across ranks.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from eroica.schema.patterns import CATEGORY_PRIORITY, Category

UNTRACKED = (Category.python, "untracked")


class Execution(NamedTuple):
    """One function execution on this rank's clock. A named tuple: a window's close and a trace's
    ingestion make tens of thousands, and a named tuple is built in well under half a frozen
    dataclass's time (docs/benchmarks.md, "Costs behind design choices")."""

    start_ns: int
    end_ns: int
    category: Category
    name: str


@dataclass
class Segments:
    """The window tiled into critical-path segments; `keys[i]` is an index into `names`."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    key: np.ndarray
    names: list[tuple[Category, str]]


def attribute(executions: list[Execution], t0: int, t1: int) -> Segments:
    """Sweep over boundaries; the best active interval (lowest priority number) wins."""
    names: list[tuple[Category, str]] = [UNTRACKED]
    index: dict[tuple[Category, str], int] = {UNTRACKED: 0}
    evs: list[tuple[int, int, int, int]] = []  # (start, end, prio, key)
    for e in executions:
        s, t = max(e.start_ns, t0), min(e.end_ns, t1)
        if t <= s:
            continue
        k = (e.category, e.name)
        if k not in index:
            index[k] = len(names)
            names.append(k)
        evs.append((s, t, CATEGORY_PRIORITY[e.category], index[k]))
    evs.sort()
    seg_s: list[int] = []
    seg_e: list[int] = []
    seg_k: list[int] = []

    def emit(a: int, b: int, k: int) -> None:
        if b <= a:
            return
        if seg_k and seg_k[-1] == k and seg_e[-1] == a:
            seg_e[-1] = b
        else:
            seg_s.append(a)
            seg_e.append(b)
            seg_k.append(k)

    active: list[tuple[int, int, int, int]] = []  # heap of (prio, start, end, key)
    now = t0
    i = 0
    n = len(evs)
    while now < t1:
        while active and active[0][2] <= now:
            heapq.heappop(active)  # lazily drop finished intervals at the top
        while i < n and evs[i][0] <= now:
            s, t, prio, key = evs[i]
            heapq.heappush(active, (prio, s, t, key))
            i += 1
        while active and active[0][2] <= now:
            heapq.heappop(active)
        nxt = evs[i][0] if i < n else t1
        if active:
            top = active[0]
            # the top holds until it ends, or until a new interval starts (which may outrank it)
            nxt = min(nxt, top[2])
            emit(now, min(nxt, t1), top[3])
        else:
            emit(now, min(nxt, t1), 0)
        now = min(nxt, t1) if nxt > now else now + 1
    return Segments(
        np.asarray(seg_s, dtype=np.int64),
        np.asarray(seg_e, dtype=np.int64),
        np.asarray(seg_k, dtype=np.int64),
        names,
    )


def per_step_critical(seg: Segments, step_bounds_ns: list[int]) -> np.ndarray:
    """Critical seconds per (key, step): shape (len(names), len(steps))."""
    n_steps = max(len(step_bounds_ns) - 1, 0)
    out = np.zeros((len(seg.names), n_steps))
    for j in range(n_steps):
        a, b = step_bounds_ns[j], step_bounds_ns[j + 1]
        s = np.clip(seg.start_ns, a, b)
        e = np.clip(seg.end_ns, a, b)
        np.add.at(out[:, j], seg.key, (e - s) / 1e9)
    return out


def metric_by_key(
    seg: Segments, sample_t_ns: np.ndarray, rate: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overlap-weighted mean and std of a per-sample-interval `rate` for each key.

    `rate[i]` is the metric over (sample_t_ns[i], sample_t_ns[i+1]). Returns (mean, std, count)
    per key; NaN where a key overlaps no sample interval.
    """
    k = len(seg.names)
    cnt = np.zeros(k, dtype=np.int64)
    if len(sample_t_ns) < 2 or len(seg.key) == 0:
        nan = np.full(k, np.nan)
        return nan, nan, cnt
    # every segment at once: the sample intervals inside a segment are whole (prefix sums over the
    # intervals); only its first and last may be cut by the segment's ends
    a_all, b_all = sample_t_ns[:-1], sample_t_ns[1:]
    ok = np.isfinite(rate)
    r0 = np.where(ok, rate, 0.0)
    full = (b_all - a_all).astype(float)
    okw = ok & (full > 0)

    def prefix(v: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(v)])
    pw, px, px2, pc = (prefix(np.where(okw, full, 0.0)), prefix(np.where(okw, full * r0, 0.0)),
                       prefix(np.where(okw, full * r0 * r0, 0.0)), prefix(okw.astype(float)))
    s_ns, e_ns, key = np.asarray(seg.start_ns), np.asarray(seg.end_ns), np.asarray(seg.key)
    lo = np.searchsorted(b_all, s_ns, side="right")
    hi = np.searchsorted(a_all, e_ns, side="left")
    has = hi > lo
    s_ns, e_ns, key, lo, hi = s_ns[has], e_ns[has], key[has], lo[has], hi[has]
    last = hi - 1

    def part(i: np.ndarray) -> tuple[np.ndarray, ...]:
        w = (np.minimum(b_all[i], e_ns) - np.maximum(a_all[i], s_ns)).astype(float)
        m = ok[i] & (w > 0)
        w = np.where(m, w, 0.0)
        return w, w * r0[i], w * r0[i] * r0[i], m.astype(float)
    first_w, first_x, first_x2, first_c = part(lo)
    two = last > lo                                     # a last interval apart from the first
    lw, lx, lx2, lc = part(last)
    inner_lo, inner_hi = lo + 1, np.maximum(last, lo + 1)       # whole intervals lo+1 .. last-1
    sums = []
    for pre, f, lpart in ((pw, first_w, lw), (px, first_x, lx), (px2, first_x2, lx2), (pc, first_c, lc)):
        v = f + np.where(two, lpart + pre[inner_hi] - pre[inner_lo], 0.0)
        sums.append(np.bincount(key, weights=v, minlength=k))
    w_sum, x_sum, x2_sum, c_sum = sums
    cnt = np.rint(c_sum).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(cnt > 0, x_sum / np.where(w_sum > 0, w_sum, np.nan), np.nan)
        var = np.maximum(x2_sum / w_sum - mean * mean, 0.0)
    return mean, np.sqrt(var), cnt


def device_first(device: list[Execution], host: list[Execution]) -> list[Execution]:
    """A GPU rank's critical path: device work holds it while the device is busy (kernels >
    memory ops > communication kernels, by priority); host-side work (ops, launches, data loading,
    Python) only where the device is idle, so a launch- or input-bound rank is found even when its
    kernels look normal. Without device work the host executions are returned as they are."""
    if not device:
        return list(host)
    busy: list[tuple[int, int]] = []
    for s, e in sorted((d.start_ns, d.end_ns) for d in device):
        if busy and s <= busy[-1][1]:
            busy[-1] = (busy[-1][0], max(busy[-1][1], e))
        else:
            busy.append((s, e))
    starts = [b[0] for b in busy]
    out = list(device)
    for h in host:
        cur = h.start_ns
        i = max(bisect.bisect_right(starts, cur) - 1, 0)
        while i < len(busy) and busy[i][0] < h.end_ns:
            bs, be = busy[i]
            if be > cur:
                if bs > cur:
                    out.append(Execution(cur, min(bs, h.end_ns), h.category, h.name))
                cur = max(cur, be)
            i += 1
        if cur < h.end_ns:
            out.append(Execution(cur, h.end_ns, h.category, h.name))
    return out
