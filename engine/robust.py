"""Robust statistics over one peer group (pure numpy): references, z scores, suspects.

Each statistic is computed once per group and read for every member: a reference that does not
depend on the member (the clean members' median from MIN_GROUP members up) is one median, not one
per rank. Leave-one-out statistics are exact below LARGE_GROUP members; from there one member
cannot move them, and the whole group's stand in.
"""

from __future__ import annotations

import numpy as np

from eroica.engine.signals import LARGE_GROUP
from eroica.schema.patterns import Category

MAD_TO_SIGMA = 1.4826
MIN_GROUP = 3                  # fewer peers than this: no valid peer group
SUSPECT_EXCESS_STEP_RATIO = 0.04   # a rank must cost the job at least this share of a step ...
SUSPECT_Z = 3.0                    # ... and stand out from its peers by this robust z
CATEGORY_SUSPECT_STEP_RATIO = 0.08  # one category alone this far above the others' (share of a step) ...
CATEGORY_SUSPECT_Z = 5.0            # ... and this many robust sigmas: a suspect even when busy time is noisy
#: categories that are near zero on a healthy rank (compute is not: it is the step's bulk and its noise)
SPARSE_CATEGORIES = {Category.data.value, Category.gc.value, Category.region.value, Category.memory.value,
                     # device kernels: data-parallel peers run the same kernels, and a GPU rank's busy
                     # time mixes them with host gaps that can hide a slower device
                     Category.kernel.value}


def _med_mad(x: np.ndarray, axis: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    med = np.median(x, axis=axis)
    return med, np.median(np.abs(x - med), axis=axis) * MAD_TO_SIGMA


def references(x: np.ndarray, floor: float, clean: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(reference value, robust z) of every member of `x` ([member] or [member, column]): the median
    and MAD of the clean members (all of them when none is clean) from MIN_GROUP members up; below
    that, the other members' median (a rank cannot be its own reference), with z in units of `floor`."""
    n = x.shape[0]
    if n >= MIN_GROUP:
        ref = x[clean] if clean is not None and clean.any() else x
        med, mad = _med_mad(ref, axis=0)
        return np.broadcast_to(med, x.shape).astype(float), (x - med) / np.maximum(mad, floor)
    refs = np.empty(x.shape, dtype=float)
    z = np.zeros(x.shape, dtype=float)
    for i in range(n):
        others = np.delete(x, i, axis=0)
        if len(others) == 0:
            refs[i] = x[i]
            continue
        refs[i] = np.median(others, axis=0)
        z[i] = (x[i] - refs[i]) / floor
    return refs, z


def clean_members(busy: np.ndarray, med_step: float, floor: float) -> np.ndarray:
    """Mask of the members that are not suspects: remove the busiest member while it stands out
    from the lower half of the rest (stragglers only ever add time, so the fast half is the
    healthy estimate even when up to half the group is slow), at most half the group. The final
    reference is then the clean members' median, so one plain median is never pulled towards
    several culprits at once.

    The members are sorted once: the rest after m removals is the m-th shortest prefix, and its
    lower half a prefix of that (ties leave the lowest rank first)."""
    n = len(busy)
    clean = np.ones(n, dtype=bool)
    if n < MIN_GROUP or med_step <= 0:
        return clean
    order = np.lexsort((-np.arange(n), busy))      # ascending busy; among equals the lowest index last
    v = busy[order]
    m = 0
    while n - m > max(n // 2, 1):
        rest = n - m
        low = v[: max((rest + 1) // 2, 2)]
        med = float(np.median(low))
        mad = float(np.median(np.abs(low - med))) * MAD_TO_SIGMA
        top = float(v[rest - 1])
        if (top - med) / med_step < SUSPECT_EXCESS_STEP_RATIO or (top - med) / max(mad, floor) < SUSPECT_Z:
            break
        clean[order[rest - 1]] = False
        m += 1
    return clean


def category_suspects(
    keys: list[tuple[str, str]], fmat: np.ndarray, med_step: float, floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Ranks on which one sparse category alone stands far above the other ranks', and by how much.

    Busy time sums many noisy parts; an intermittent or small fault (a stall every third step) can
    hide in that noise, and a rank that thrashes can slow its whole host so that it is not even the
    latest, while its own category (data loading, GC, a user region) is unmistakable."""
    n = fmat.shape[0]
    flag = np.zeros(n, dtype=bool)
    excess = np.zeros(n)
    if n < 2 or med_step <= 0:
        return flag, excess
    for cat in sorted({k[0] for k in keys} & SPARSE_CATEGORIES):
        idx = [j for j, k in enumerate(keys) if k[0] == cat]
        sums = fmat[:, idx].sum(axis=1)
        need = SUSPECT_EXCESS_STEP_RATIO if cat == Category.kernel.value else CATEGORY_SUSPECT_STEP_RATIO
        if n >= LARGE_GROUP:          # one rank cannot move the median and MAD of this many: all ranks'
            gmed, gmad = (float(a) for a in _med_mad(sums))
            ex = sums - gmed
            hit = (ex > 0) & (ex / med_step >= need) & (ex / max(gmad, floor) >= CATEGORY_SUSPECT_Z)
            flag |= hit
            excess = np.where(hit, np.maximum(excess, ex), excess)
            continue
        for i in range(n):
            med, mad = (float(a) for a in _med_mad(np.delete(sums, i)))
            ex = float(sums[i] - med)
            if ex / med_step >= need and ex / max(mad, floor) >= CATEGORY_SUSPECT_Z:
                flag[i] = True
                excess[i] = max(excess[i], ex)
    return flag, excess


def paired_t(busy_steps: np.ndarray, members: np.ndarray, clean: np.ndarray, floor: float) -> np.ndarray:
    """t statistic of each of `members`' per-step busy excess over the clean ranks' per-step median
    (without the member itself below LARGE_GROUP ranks).

    With a handful of peers the spread of their averages is a poor noise estimate; the rank's own
    step-to-step excess is many more samples: a fault shows up step after step, noise does not."""
    n, steps = busy_steps.shape
    t = np.zeros(len(members))
    if steps < 3 or len(members) == 0:
        return t
    if n >= LARGE_GROUP:
        if not clean.any():
            return t
        ref = np.median(busy_steps[clean], axis=0)
        d = busy_steps[members] - ref
        sd = np.maximum(np.std(d, axis=1, ddof=1), floor)
        out: np.ndarray = np.mean(d, axis=1) / (sd / np.sqrt(steps))
        return out
    for k, i in enumerate(members):
        ref_rows = busy_steps[clean & (np.arange(n) != i)]
        if len(ref_rows) == 0:
            continue
        d = busy_steps[i] - np.median(ref_rows, axis=0)
        sd = max(float(np.std(d, ddof=1)), floor)
        t[k] = float(np.mean(d) / (sd / np.sqrt(len(d))))
    return t
