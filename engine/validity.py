"""Is a peer group a group of equals? Ranks that do different work by design are no peers.

Three tests, cheapest evidence first: the programs differ (a compute function runs a different
whole number of times per step: models of different depth); the compute work splits into two tight
modes; or it spreads over several levels (a robust dispersion test). Each says why, in words an SRE
can check, and an invalid group lowers the confidence of every finding in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eroica.engine.columns import METRICS
from eroica.engine.groups import bimodal_split
from eroica.engine.robust import MAD_TO_SIGMA, MIN_GROUP, SUSPECT_EXCESS_STEP_RATIO
from eroica.schema.patterns import Category, MetricName

if TYPE_CHECKING:
    from eroica.engine.peer import GroupView

COMPUTE_KINDS = {Category.compute.value, Category.kernel.value}
CPU_UTIL = METRICS.index(MetricName.cpu_util_ratio)
MAX_DISPERSION = 0.35          # peers' busy-time MAD / median above this: heterogeneous group
# compute work (CPU-seconds) of all members, robust dispersion above this: work spread by design.
# Equal peers with one or two culprits in the library: at most 0.24 (CPU rate noise of 4 ranks on 2
# cores); graded levels 1x..2x: 0.31-0.33
MAX_WORK_DISPERSION = 0.28


def validity(g: GroupView, gname: str, how: str, fmat: np.ndarray, busy: np.ndarray, clean: np.ndarray,
              floor: float) -> tuple[bool, str, float]:
    """Is this a group of equals? (valid, reason, busy-time dispersion of the clean members)."""
    n = len(g.ranks)
    disp = 0.0
    if n >= 3:
        cb = busy[clean]
        tmed = float(np.median(cb))
        disp = float(np.median(np.abs(cb - tmed)) * MAD_TO_SIGMA / tmed) if tmed > 0 else 0.0
    # the work each rank's compute does per step (CPU-seconds: contention stretches the wall time of
    # the same work, and by-design heterogeneity is more work); two tight modes = different work
    work = compute_work(g, fmat)
    modes = bimodal_split(work, floor) if n >= 4 and work.any() else None
    if n < MIN_GROUP:
        return False, f"only {n} rank(s) in group {gname!r} ({how}): too few peers to compare", disp
    if modes is not None:
        lo, hi = modes
        cl, ch = (float(np.median(work[idx])) for idx in (lo, hi))
        his, los = (", ".join(str(g.ranks[j]) for j in idx) for idx in (hi, lo))
        return False, (
            f"peers in group {gname!r} ({how}) disagree: ranks {his} do {ch / cl:.1f}x the compute "
            f"work (CPU-seconds) of ranks {los} (two modes): different work by design, or half the group "
            f"affected; declare roles to compare like with like"), disp
    programs = different_programs(g)
    if programs is not None and n >= 2:
        fn, counts = programs
        per_rank = ", ".join(f"{r}: {c:g}" for r, c in counts)
        return False, (
            f"peers in group {gname!r} ({how}) run different programs: {fn} executes a different number of "
            f"times per step (rank: count {per_rank}), the same on every step: a deeper model or other work by "
            f"design, not a slowdown; declare roles to compare like with like"), disp
    spread = work_dispersion(work) if n >= 3 else 0.0
    if spread > MAX_WORK_DISPERSION and not too_little_work(work, float(np.median(g.step))):
        lo_w = float(work[work > 0].min()) if (work > 0).any() else 0.0
        levels = ", ".join(f"{g.ranks[j]}: {work[j] / lo_w:.2f}x" for j in np.argsort(work)) if lo_w > 0 else ""
        return False, (
            f"peers in group {gname!r} ({how}) do different work by design: their compute work spreads over "
            f"several levels rather than one rank standing out (dispersion {spread:.0%} of the median; rank: "
            f"work vs the least, {levels}): no valid peer group; declare roles to compare like with like"), disp
    if disp > MAX_DISPERSION:
        return False, (f"peers in group {gname!r} ({how}) disagree (busy-time dispersion "
                       f"{disp:.0%}): they do different work; declare roles to compare like with like"), disp
    return True, f"{n} ranks in group {gname!r} ({how}) doing the same work", disp


def different_programs(g: GroupView) -> tuple[str, list[tuple[int, float]]] | None:
    """Structural evidence that members do different work by design: a compute function that every
    member runs at least once per step, run a different whole number of times per step (e.g. 11,
    14, 18, 21 autograd nodes of a linear layer: models of different depth). A fault stretches the
    time of the same operations (more samples, a slower CPU, a stall); it does not change how many
    there are. A light window times the backward pass as one function; its autograd node counts by type
    are the same evidence. Returns (function, [(rank, count per step)]) for the largest difference, or None."""
    steps = g.step.shape[1]
    if steps < 2 or len(g.ranks) < 2:
        return None
    # the host ops are the program; a device kernel's count follows the shapes it is given (cuBLAS
    # splits a bigger batch's GEMM into more kernels: 15 per step on an H200 against its peers' 9), so
    # kernels count only in a trace that has no host ops
    host = any(k[0] == Category.compute.value for k in g.keys)
    kinds = {Category.compute.value} if host else COMPUTE_KINDS
    idx = [j for j, k in enumerate(g.keys) if k[0] in kinds and g.present[:, j].all()]
    found = _whole_count_spread([g.keys[j][1] for j in idx], g.occurrences[:, idx], g, g.n_steps) if idx else None
    if found is None and g.nodes and all(g.nodes):
        # a light window's functions are whole passes; its node counts by type say the same
        counted = [dict(n) for n in g.nodes]
        names = sorted(set.intersection(*(set(c) for c in counted)))
        if names:
            occ = np.array([[c[k] for k in names] for c in counted], dtype=float)
            found = _whole_count_spread(names, occ, g, g.node_steps)
    return found


def _whole_count_spread(names: list[str], occ: np.ndarray, g: GroupView,
                        steps: np.ndarray) -> tuple[str, list[tuple[int, float]]] | None:
    """The name whose whole count per step (at least one on every member) differs most, by >= 1.
    `steps`: the steps each member's counts cover."""
    per_step = occ / np.maximum(steps[:, None], 1)
    whole = np.abs(per_step - np.round(per_step)) < 0.05           # complete steps: whole counts
    ok = (per_step >= 1.0).all(axis=0) & whole.all(axis=0)
    spread = np.where(ok, per_step.max(axis=0) - per_step.min(axis=0), 0.0)
    j = int(np.argmax(spread)) if len(spread) else 0
    if not len(spread) or spread[j] < 1.0:
        return None
    return names[j], [(r, round(float(c), 1)) for r, c in zip(g.ranks, per_step[:, j])]


def too_little_work(work: np.ndarray, step_seconds: float) -> bool:
    """Levels of compute work too close to matter: the most and the least work per step differ by less
    than the smallest excess that makes a suspect (SUSPECT_EXCESS_STEP_RATIO of a step). A job that
    spends nearly its whole step communicating (a capped link: compute 3% of a 264 ms step) has a few
    ms of compute per rank, whose CPU rate on a busy host spreads over "levels" that no comparison of
    busy time could mistake for a late rank; they are not different work by design."""
    return bool(step_seconds > 0 and float(work.max() - work.min()) < SUSPECT_EXCESS_STEP_RATIO * step_seconds)


def work_dispersion(work: np.ndarray) -> float:
    """Robust spread of the members' compute work (1.4826 x MAD / median, over every member). One
    rank that does much more (a culprit) barely moves a median absolute deviation; work that
    spreads over several levels by design (1x, 1.3x, 1.6x, 2x: 0.31) does."""
    if len(work) < 3 or not work.any():
        return 0.0
    med = float(np.median(work))
    return float(np.median(np.abs(work - med)) * MAD_TO_SIGMA / med) if med > 0 else 0.0


def compute_work(g: GroupView, fmat: np.ndarray) -> np.ndarray:
    """Compute work per step of each member: critical seconds of compute ops times their CPU rate
    (on-CPU share) where the metric is the CPU rate; on a device job, its kernels' time."""
    # on a device job the device's kernels are the work; host ops on its critical path fill the
    # device's idle gaps (a late host is a fault, not more work)
    kinds = {Category.kernel.value} if any(k[0] == Category.kernel.value for k in g.keys) else COMPUTE_KINDS
    idx = [j for j, k in enumerate(g.keys) if k[0] in kinds]
    if not idx:
        return np.zeros(len(g.ranks))
    f = fmat[:, idx]
    rate = np.where((g.metric_code[:, idx] == CPU_UTIL) & ~np.isnan(g.metric_mean[:, idx]),
                    g.metric_mean[:, idx], 1.0)
    out: np.ndarray = np.where(f > 0, f * rate, 0.0).sum(axis=1)
    return out


