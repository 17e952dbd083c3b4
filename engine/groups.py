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

import numpy as np

from eroica.collector.facts import Category, PatternsDoc

PARTITION_DESC = re.compile(r"(^|[^a-z])(pp|pipe|pipeline|stage|ep|expert|experts|moe)([^a-z]|$)", re.IGNORECASE)
OP_KINDS = {Category.compute, Category.kernel, Category.memory}
SAME_OPS_JACCARD = 0.6    # op sets at least this similar are the same work


@dataclass(frozen=True)
class Grouping:
    name: str
    ranks: list[int]
    how: str              # "declared role", "process-group layout", "op-mix clustering", "one group"


def _partition(doc: PatternsDoc) -> str:
    return "/".join(f"{g.desc}{g.index}" for g in doc.job.process_groups if PARTITION_DESC.search(g.desc))


def _ops(doc: PatternsDoc) -> frozenset[str]:
    # every op the collector kept (it drops those under 0.5% of the critical path); an op flapping
    # around that cut moves the similarity a little, not below SAME_OPS_JACCARD
    return frozenset(f.name for f in doc.functions if f.category in OP_KINDS)


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def _cluster_by_ops(ranks: list[int], docs: dict[int, PatternsDoc]) -> list[list[int]]:
    """Greedy: each rank joins the first cluster whose founder runs a similar op set."""
    clusters: list[tuple[frozenset[str], list[int]]] = []
    for r in ranks:
        ops = _ops(docs[r])
        for founder, members in clusters:
            if _jaccard(ops, founder) >= SAME_OPS_JACCARD:
                members.append(r)
                break
        else:
            clusters.append((ops, [r]))
    return [m for _, m in clusters]


def peer_groups(docs: dict[int, PatternsDoc]) -> list[Grouping]:
    by_role: dict[str, list[int]] = {}
    for r, d in sorted(docs.items()):
        by_role.setdefault(d.job.role, []).append(r)
    declared = len(by_role) > 1 or any(role != "worker" for role in by_role)
    out: list[Grouping] = []
    for role, ranks in by_role.items():
        parts: dict[str, list[int]] = {}
        for r in ranks:
            parts.setdefault(_partition(docs[r]), []).append(r)
        if len(parts) > 1:
            out += [Grouping(f"{role}/{p}" if p else role, m, "process-group layout") for p, m in sorted(parts.items())]
            continue
        if declared:
            out.append(Grouping(role, ranks, "declared role"))
            continue
        clusters = _cluster_by_ops(ranks, docs)
        # a lone rank with an op set of its own is more likely a fault than a design: keep it in
        if len(clusters) > 1 and all(len(c) >= 2 for c in clusters):
            out += [Grouping(f"{role}~{i}", c, "op-mix clustering") for i, c in enumerate(clusters)]
        else:
            out.append(Grouping(role, ranks, "one group"))
    return out


BIMODAL_RATIO = 1.3        # the upper mode's median at least this far above the lower one's ...
BIMODAL_GAP_MAD = 3.0      # ... with a gap of this many within-mode MADs between them ...
MODE_SPREAD_RATIO = 1.3    # ... and each mode tight (max / min): by design, not a fault and its victims


def bimodal_split(values: list[float], floor: float) -> tuple[list[int], list[int]] | None:
    """Indices (lower, upper) when `values` (one per rank) fall into two tight, well separated modes
    of at least two ranks and a quarter of the group each; None otherwise.

    Ranks that do different work by design (pipeline stages of unequal cost, uneven shards) show up
    as two modes of compute time. A fault on one rank, or a fault and the host neighbours it slows,
    does not: a single rank is never a mode, and a fault's victims are not as tight as its culprit."""
    n = len(values)
    order = sorted(range(n), key=lambda i: values[i])
    v = [values[i] for i in order]
    for k in range(2, n - 1):          # k = size of the upper mode
        lo, hi = v[: n - k], v[n - k:]
        if len(lo) < 2 or min(len(lo), len(hi)) < n / 4:
            continue
        mlo, mhi = float(np.median(lo)), float(np.median(hi))
        if mlo <= 0 or mhi / mlo < BIMODAL_RATIO:
            continue
        if hi[-1] / max(hi[0], 1e-12) > MODE_SPREAD_RATIO or lo[-1] / max(lo[0], 1e-12) > MODE_SPREAD_RATIO:
            continue
        mad = max(float(np.median(np.abs(np.asarray(lo) - mlo))), float(np.median(np.abs(np.asarray(hi) - mhi))))
        if hi[0] - lo[-1] > BIMODAL_GAP_MAD * max(mad * 1.4826, floor):
            return sorted(order[: n - k]), sorted(order[n - k:])
    return None
