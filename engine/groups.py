"""Peer groups: which ranks should do the same work, so that one can be compared with the others.

In order of trust:
1. the role each rank declares (`Monitor(..., role="stage1")`);
2. the process-group layout the collector read: a rank's position in a pipeline or expert group
   (`group_desc` or a DeviceMesh dimension named pp / pipe / stage / ep / expert / moe) is a
   partition of the model, and only ranks at the same position do the same work;
3. otherwise, clustering the ranks by the compute ops they run (their op mix): ranks that run
   different ops do different work. Durations are never used to cluster: that would put the
   slow ranks of a fault in a group of their own and hide them.
A group formed any way is still checked for agreement by the peer comparison (peer.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eroica.schema.patterns import Category, PatternsDoc

if TYPE_CHECKING:
    from eroica.engine.columns import WindowColumns

PARTITION_DESC = re.compile(r"(^|[^a-z])(pp|pipe|pipeline|stage|ep|expert|experts|moe)([^a-z]|$)", re.IGNORECASE)
OP_KINDS = {Category.compute, Category.kernel, Category.memory}
SAME_OPS_JACCARD = 0.6    # op sets at least this similar are the same work


@dataclass(frozen=True)
class Grouping:
    name: str
    ranks: list[int]
    how: str              # "declared role", "process-group layout", "op-mix clustering", "one group"


def partition(doc: PatternsDoc) -> str:
    """The rank's position in the pipeline / expert process groups ("" when it has none)."""
    return "/".join(f"{g.desc}{g.index}" for g in doc.job.process_groups if PARTITION_DESC.search(g.desc))


DEVICE_OP_KINDS = {Category.kernel, Category.memory}


def op_set(doc: PatternsDoc) -> frozenset[str]:
    # every op the collector kept (it drops those under 0.5% of the critical path); an op flapping
    # around that cut moves the similarity a little, not below SAME_OPS_JACCARD. On a device rank
    # only the device's ops count: host-side ops reach the critical path only where the device idles
    # (device_first), so which of them are kept is timing, and a late host (a fault on two ranks)
    # would otherwise form a group of its own
    kinds = DEVICE_OP_KINDS if any(f.category == Category.kernel for f in doc.functions) else OP_KINDS
    return frozenset(f.name for f in doc.functions if f.category in kinds)


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def _cluster_by_ops(ranks: list[int], cols: WindowColumns) -> list[list[int]]:
    """Greedy: each rank joins the first cluster whose founder runs a similar op set (ranks share
    a handful of distinct op sets, so each pair of sets is compared once)."""
    clusters: list[tuple[int, list[int]]] = []
    similar: dict[tuple[int, int], bool] = {}
    for r in ranks:
        ops = int(cols.ops[cols.row[r]])
        for founder, members in clusters:
            key = (ops, founder)
            if key not in similar:
                similar[key] = _jaccard(cols.op_sets[ops], cols.op_sets[founder]) >= SAME_OPS_JACCARD
            if similar[key]:
                members.append(r)
                break
        else:
            clusters.append((ops, [r]))
    return [m for _, m in clusters]


def peer_groups(cols: WindowColumns) -> list[Grouping]:
    by_role: dict[str, list[int]] = {}
    for i, r in enumerate(cols.ranks):
        by_role.setdefault(cols.role[i], []).append(r)
    declared = len(by_role) > 1 or any(role != "worker" for role in by_role)
    out: list[Grouping] = []
    for role, ranks in by_role.items():
        parts: dict[str, list[int]] = {}
        for r in ranks:
            parts.setdefault(cols.partition[cols.row[r]], []).append(r)
        if len(parts) > 1:
            out += [Grouping(f"{role}/{p}" if p else role, m, "process-group layout") for p, m in sorted(parts.items())]
            continue
        if declared:
            out.append(Grouping(role, ranks, "declared role"))
            continue
        clusters = _cluster_by_ops(ranks, cols)
        # a lone rank with an op set of its own is more likely a fault than a design: keep it in
        if len(clusters) > 1 and all(len(c) >= 2 for c in clusters):
            out += [Grouping(f"{role}~{i}", c, "op-mix clustering") for i, c in enumerate(clusters)]
        else:
            out.append(Grouping(role, ranks, "one group"))
    return out


BIMODAL_RATIO = 1.3        # the upper mode's median at least this far above the lower one's ...
BIMODAL_GAP_MAD = 3.0      # ... with a gap of this many within-mode MADs between them ...
MODE_SPREAD_RATIO = 1.3    # ... and each mode tight (max / min): by design, not a fault and its victims


def bimodal_split(values: list[float] | np.ndarray, floor: float) -> tuple[list[int], list[int]] | None:
    """Indices (lower, upper) when `values` (one per rank) fall into two tight, well separated modes
    of at least two ranks and a quarter of the group each; None otherwise.

    Ranks that do different work by design (pipeline stages of unequal cost, uneven shards) show up
    as two modes of compute time. A fault on one rank, or a fault and the host neighbours it slows,
    does not: a single rank is never a mode, and a fault's victims are not as tight as its culprit.
    Every split point is screened at once on the sorted values; only those that pass the median,
    spread and gap tests get the within-mode MAD, smallest upper mode first."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 4:
        return None
    order = np.argsort(x, kind="stable")
    v = x[order]
    k = np.arange(2, n - 1)                       # size of the upper mode
    m = n - k                                     # size of the lower mode
    ok = (m >= 2) & (np.minimum(m, k) >= n / 4)
    mlo = (v[(m - 1) // 2] + v[m // 2]) / 2       # medians of the sorted prefixes / suffixes
    mhi = (v[m + (k - 1) // 2] + v[m + k // 2]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ok &= (mlo > 0) & (mhi / np.where(mlo > 0, mlo, 1.0) >= BIMODAL_RATIO)
    ok &= v[-1] / np.maximum(v[m], 1e-12) <= MODE_SPREAD_RATIO
    ok &= v[m - 1] / np.maximum(v[0], 1e-12) <= MODE_SPREAD_RATIO
    ok &= v[m] - v[m - 1] > BIMODAL_GAP_MAD * floor           # necessary: the MAD term is at least `floor`
    for kk in k[ok]:
        lo, hi = v[: n - kk], v[n - kk:]
        mlo_, mhi_ = float(np.median(lo)), float(np.median(hi))
        if mlo_ <= 0 or mhi_ / mlo_ < BIMODAL_RATIO:
            continue
        mad = max(float(np.median(np.abs(lo - mlo_))), float(np.median(np.abs(hi - mhi_))))
        if hi[0] - lo[-1] > BIMODAL_GAP_MAD * max(mad * 1.4826, floor):
            return sorted(order[: n - kk].tolist()), sorted(order[n - kk:].tolist())
    return None
