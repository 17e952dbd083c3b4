"""Peer comparison with robust statistics (pure numpy): per-rank patterns in, deviating facts out.

Synchronous collectives turn one late rank into waiting time on every other rank, so durations
of communication cannot name the culprit: the victims wait *longer* in communication and the
culprit waits *least*. We therefore compare each rank's *busy* time (step time minus time the
critical path spent waiting in communication) against the median of its peer group, and
attribute the excess to the functions that hold the critical path longer than on the peers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eroica.collector.facts import Category, PatternsDoc
from eroica.engine.facts import (
    CategoryExcess,
    ConfigDeviation,
    Fact,
    FunctionOutlier,
    RankSlowness,
    StepShare,
)
from eroica.engine.groups import bimodal_split, peer_groups
from eroica.engine.links import link_facts
from eroica.engine.load import WindowData
from eroica.engine.signals import LARGE_GROUP, cap_ratio, host_cpu_facts, hw_signals, outlier_facts
from eroica.engine.spikes import kept_steps, spike_facts

MAD_TO_SIGMA = 1.4826
MIN_GROUP = 3                  # fewer peers than this: no valid peer group
MAX_DISPERSION = 0.35          # peers' busy-time MAD / median above this: heterogeneous group
SUSPECT_EXCESS_STEP_RATIO = 0.04   # a rank must cost the job at least this share of a step ...
SUSPECT_Z = 3.0                    # ... and stand out from its peers by this robust z
SMALL_GROUP_MIN_RATIO = 1.1        # below 3 members: busy at least this much more than the other
SUSPECT_T = 4.0                    # or: excess consistent across the window's steps (paired t statistic)
CATEGORY_SUSPECT_STEP_RATIO = 0.08  # one category alone this far above the others' (share of a step) ...
CATEGORY_SUSPECT_Z = 5.0            # ... and this many robust sigmas: a suspect even when busy time is noisy
#: categories that are near zero on a healthy rank (compute is not: it is the step's bulk and its noise)
SPARSE_CATEGORIES = {Category.data.value, Category.gc.value, Category.region.value, Category.memory.value,
                     # device kernels: data-parallel peers run the same kernels, and a GPU rank's busy
                     # time mixes them with host gaps that can hide a slower device
                     Category.kernel.value}
FUNCTION_MIN_EXPLAINS = 0.1
COMPUTE_KINDS = {Category.compute.value, Category.kernel.value}
CONFIG_KEYS_IGNORED = ("torch.version",)


def _key(cat: Category, name: str) -> tuple[str, str]:
    # GC generations are one function for comparison: peers collect young generations too
    if cat == Category.gc:
        return ("gc", "gc.collect")
    return (cat.value, name)


def robust_z(x: np.ndarray, floor: float) -> np.ndarray:
    med = np.median(x)
    mad = np.median(np.abs(x - med)) * MAD_TO_SIGMA
    return (x - med) / max(mad, floor)


def _reference(x: np.ndarray, i: int, floor: float, clean: np.ndarray | None = None) -> tuple[float, float]:
    """(reference value, robust z) of member i: the median and MAD of the group's clean members
    (all but the suspects) from 3 members up; below that, the other members' median (a rank
    cannot be its own reference)."""
    if len(x) >= MIN_GROUP:
        ref = x[clean] if clean is not None and clean.any() else x
        med = float(np.median(ref))
        mad = float(np.median(np.abs(ref - med))) * MAD_TO_SIGMA
        return med, float((x[i] - med) / max(mad, floor))
    others = np.delete(x, i)
    if len(others) == 0:
        return float(x[i]), 0.0
    ref = float(np.median(others))
    return ref, float((x[i] - ref) / floor)


def clean_members(busy: np.ndarray, med_step: float, floor: float) -> np.ndarray:
    """Mask of the members that are not suspects: remove the busiest member while it stands out
    from the lower half of the rest (stragglers only ever add time, so the fast half is the
    healthy estimate even when up to half the group is slow), at most half the group. The final
    reference is then the clean members' median, so one plain median is never pulled towards
    several culprits at once."""
    clean = np.ones(len(busy), dtype=bool)
    if len(busy) < MIN_GROUP or med_step <= 0:
        return clean
    while clean.sum() > max(len(busy) // 2, 1):
        vals = busy[clean]
        low = np.sort(vals)[: max((len(vals) + 1) // 2, 2)]
        med = float(np.median(low))
        mad = float(np.median(np.abs(low - med))) * MAD_TO_SIGMA
        j = int(np.flatnonzero(clean)[int(np.argmax(vals))])
        if (busy[j] - med) / med_step < SUSPECT_EXCESS_STEP_RATIO or (busy[j] - med) / max(mad, floor) < SUSPECT_Z:
            break
        clean[j] = False
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
        # the others' median and MAD; from LARGE_GROUP members one rank cannot move them: all ranks'
        gmed = float(np.median(sums))
        gmad = float(np.median(np.abs(sums - gmed))) * MAD_TO_SIGMA
        for i in (np.flatnonzero(sums - gmed > 0) if n >= LARGE_GROUP else range(n)):
            if n >= LARGE_GROUP:
                med, mad = gmed, gmad
            else:
                others = np.delete(sums, i)
                med = float(np.median(others))
                mad = float(np.median(np.abs(others - med))) * MAD_TO_SIGMA
            ex = float(sums[i] - med)
            need = SUSPECT_EXCESS_STEP_RATIO if cat == Category.kernel.value else CATEGORY_SUSPECT_STEP_RATIO
            if ex / med_step >= need and ex / max(mad, floor) >= CATEGORY_SUSPECT_Z:
                flag[i] = True
                excess[i] = max(excess[i], ex)
    return flag, excess


def paired_t(busy_steps: np.ndarray, i: int, clean: np.ndarray, floor: float) -> float:
    """t statistic of rank i's per-step busy excess over the clean ranks' per-step median.

    With a handful of peers the spread of their averages is a poor noise estimate; the rank's own
    step-to-step excess is many more samples: a fault shows up step after step, noise does not."""
    ref_rows = busy_steps[clean & (np.arange(len(busy_steps)) != i)]
    if len(ref_rows) == 0 or busy_steps.shape[1] < 3:
        return 0.0
    d = busy_steps[i] - np.median(ref_rows, axis=0)
    sd = max(float(np.std(d, ddof=1)), floor)
    return float(np.mean(d) / (sd / np.sqrt(len(d))))


@dataclass
class PeerGroup:
    name: str
    ranks: list[int]
    valid: bool
    reason: str
    dispersion_ratio: float


@dataclass
class RankRow:
    """Per-rank numbers the report shows (not rule facts)."""

    rank: int
    step_seconds: float
    busy_seconds: float
    comm_wait_seconds: float


@dataclass
class PeerAnalysis:
    window_id: str
    groups: list[PeerGroup]
    facts: list[Fact]
    rows: dict[int, RankRow]


def _per_step(doc: PatternsDoc) -> tuple[dict[tuple[str, str], np.ndarray], np.ndarray]:
    steps = np.asarray(doc.step_times.during_seconds, dtype=float)
    n = max(len(steps), 1)
    out: dict[tuple[str, str], np.ndarray] = {}
    for f in doc.functions:
        k = _key(f.category, f.name)
        v = np.asarray(f.critical_per_step_seconds, dtype=float)
        if len(v) != len(steps):
            v = np.full(n, f.critical_seconds / n)
        out[k] = out.get(k, np.zeros(n)) + v
    return out, steps


def analyze(window: WindowData) -> PeerAnalysis:
    docs = window.docs
    facts: list[Fact] = []
    groups: list[PeerGroup] = []
    rows: dict[int, RankRow] = {}
    for grouping in peer_groups(docs):
        gname, ranks = grouping.name, grouping.ranks
        per = {r: _per_step(docs[r]) for r in ranks}
        keys = sorted({k for r in ranks for k in per[r][0]})
        n_steps = min(len(per[r][1]) for r in ranks) or 1
        step = np.array([per[r][1][:n_steps] for r in ranks])
        comm_idx = [i for i, k in enumerate(keys) if k[0] == Category.communication.value]
        comm_steps = np.array(
            [sum((per[r][0].get(keys[i], np.zeros(n_steps))[:n_steps] for i in comm_idx), np.zeros(n_steps))
             for r in ranks]
        )
        busy_steps = np.maximum(step - comm_steps, 0.0)
        # a rare one-off spike step is reported on its own and left out of the comparison
        keep = kept_steps(step)
        fkeep = keep if len(keep) == n_steps else np.ones(n_steps, dtype=bool)   # no step times at all
        start = min(docs[r].window.start_step for r in ranks)
        facts.extend(spike_facts(ranks, start, step, busy_steps, [per[r][0] for r in ranks], keep,
                                 [docs[r].hardware.per_step for r in ranks]))
        step, comm_steps, busy_steps = step[:, keep], comm_steps[:, keep], busy_steps[:, keep]
        # matrix [rank, key] of mean critical seconds per kept step; [rank, step] busy per step
        fmat = np.array([[per[r][0].get(k, np.zeros(n_steps))[:n_steps][fkeep].mean() for k in keys] for r in ranks])
        busy = busy_steps.mean(axis=1)
        comm = comm_steps.mean(axis=1)
        step_mean = step.mean(axis=1)
        med_step = float(np.median(step_mean))
        for i, r in enumerate(ranks):
            rows[r] = RankRow(r, float(step_mean[i]), float(busy[i]), float(comm[i]))
        n = len(ranks)
        floor = max(0.01 * med_step, 1e-4)
        clean = clean_members(busy, med_step, floor)
        cat_flag, cat_excess = category_suspects(keys, fmat, med_step, floor)
        if n >= MIN_GROUP and (~cat_flag).sum() >= max(n // 2, 1):
            clean &= ~cat_flag
        # dispersion of the clean members (suspects aside): is this a group of equals?
        if n >= 3:
            cb = busy[clean]
            tmed = float(np.median(cb))
            disp = float(np.median(np.abs(cb - tmed)) * MAD_TO_SIGMA / tmed) if tmed > 0 else 0.0
        else:
            disp = 0.0
        # the work each rank's compute does per step (CPU-seconds: contention stretches the wall time of
        # the same work, and by-design heterogeneity is more work); two tight modes = different work
        work = [_compute_work(docs[r], keys, fmat[i]) for i, r in enumerate(ranks)]
        modes = bimodal_split(work, floor) if n >= 4 and any(work) else None
        if n < MIN_GROUP:
            valid, reason = False, f"only {n} rank(s) in group {gname!r} ({grouping.how}): too few peers to compare"
        elif modes is not None:
            lo, hi = modes
            cl, ch = (float(np.median([work[j] for j in idx])) for idx in (lo, hi))
            his, los = (", ".join(str(ranks[j]) for j in idx) for idx in (hi, lo))
            valid, reason = False, (
                f"peers in group {gname!r} ({grouping.how}) disagree: ranks {his} do {ch / cl:.1f}x the compute "
                f"work (CPU-seconds) of ranks {los} (two modes): different work by design, or half the group "
                f"affected; declare roles to compare like with like")
        elif disp > MAX_DISPERSION:
            valid, reason = False, (f"peers in group {gname!r} ({grouping.how}) disagree (busy-time dispersion "
                                    f"{disp:.0%}): they do different work; declare roles to compare like with like")
        else:
            valid, reason = True, f"{n} ranks in group {gname!r} ({grouping.how}) doing the same work"
        groups.append(PeerGroup(gname, ranks, valid, reason, round(disp, 4)))
        if not valid:   # no peers to compare with: state the step's make-up for expected-range rules
            facts.extend(step_shares(ranks, keys, fmat, step.mean(axis=1) if step.size else np.zeros(n)))
        if n < 2:
            continue
        min_comm = float(comm.min())
        med_comm = float(np.median(comm[clean]))
        ref_clean = clean if n >= MIN_GROUP else None
        for i, r in enumerate(ranks):
            ref_busy, z = _reference(busy, i, floor, ref_clean)
            # a sparse category far above the peers is this rank's cost even if the rest of its step
            # happened to run faster (its own slowdown spread over the host)
            excess = max(float(busy[i] - ref_busy), float(cat_excess[i]))
            excess_ratio = excess / med_step if med_step > 0 else 0.0
            if excess_ratio < SUSPECT_EXCESS_STEP_RATIO:
                continue
            # the per-step test only where the robust z alone does not decide (it is O(group) per rank)
            if z < SUSPECT_Z and not cat_flag[i] and paired_t(busy_steps, i, clean, floor) < SUSPECT_T:
                continue
            if n < MIN_GROUP and cap_ratio(float(busy[i]), ref_busy) < SMALL_GROUP_MIN_RATIO and not cat_flag[i]:
                continue
            med_busy_steps = np.median(busy_steps[clean] if clean.any() else busy_steps, axis=0)
            consistency = float(np.mean(busy_steps[i] > med_busy_steps + 0.5 * excess))
            facts.append(
                RankSlowness(
                    rank=r, group=gname,
                    busy_seconds_per_step=round(float(busy[i]), 6),
                    peer_median_busy_seconds_per_step=round(ref_busy, 6),
                    excess_seconds_per_step=round(excess, 6),
                    excess_step_ratio=round(excess_ratio, 4),
                    busy_ratio_to_median=round(cap_ratio(float(busy[i]), ref_busy), 4),
                    comm_wait_ratio_to_median=round(cap_ratio(float(comm[i]), med_comm), 4),
                    least_waiting=bool(comm[i] <= min_comm + 1e-9),
                    robust_z=round(float(min(z, 1e6)), 3),
                    consistency_ratio=round(consistency, 4),
                    peers=n, group_valid=valid,
                )
            )
            refs = [_reference(fmat[:, j], i, floor, ref_clean) for j in range(len(keys))]
            fmed = np.array([x[0] for x in refs])
            fz = np.array([x[1] for x in refs])
            facts.extend(_function_outliers(docs, r, keys, fmat[i], fmed, fz, excess, ranks))
            facts.extend(_category_excess(docs, r, keys, fmat, fmed, i, excess, ranks, floor, ref_clean))
            peers = [p for j, p in enumerate(ranks) if p != r and clean[j]] or [p for p in ranks if p != r]
            facts.extend(hw_signals(docs, r, [r, *peers], keep))
            facts.extend(host_cpu_facts(docs, r, keep))
            facts.extend(_config_deviations(docs, r, [r, *peers]))
        suspects = {f.rank for f in facts if isinstance(f, RankSlowness) and f.group == gname}
        facts.extend(outlier_facts(docs, ranks, keep, suspects, float(np.median(step))))
        facts.extend(link_facts(docs, ranks, {r: float(comm[i]) for i, r in enumerate(ranks)}))
    return PeerAnalysis(window.window_id, groups, facts, rows)


SHARE_CATEGORIES = (Category.data.value, Category.gc.value, Category.region.value, Category.memory.value)
MIN_SHARE = 0.05


def step_shares(ranks: list[int], keys: list[tuple[str, str]], fmat: np.ndarray, step: np.ndarray) -> list[Fact]:
    out: list[Fact] = []
    for i, r in enumerate(ranks):
        for cat in SHARE_CATEGORIES:
            idx = [j for j, k in enumerate(keys) if k[0] == cat]
            sec = float(fmat[i, idx].sum()) if idx else 0.0
            if step[i] <= 0 or sec / step[i] < MIN_SHARE:
                continue
            top = keys[max(idx, key=lambda j: fmat[i, j])][1]
            out.append(StepShare(rank=r, category=cat, share_ratio=round(min(sec / step[i], 1.0), 4),
                                 seconds_per_step=round(sec, 6), top_function=top, group_valid=False))
    return out


def _compute_work(doc: PatternsDoc, keys: list[tuple[str, str]], row: np.ndarray) -> float:
    """Compute work per step: critical seconds of compute ops times their CPU rate (on-CPU share)
    where the metric is the CPU rate; GPU kernels count their time."""
    total = 0.0
    for j, k in enumerate(keys):
        if k[0] not in COMPUTE_KINDS or row[j] <= 0:
            continue
        name, mean, _ = _metric(doc, k)
        total += float(row[j]) * (mean if name == "cpu_util_ratio" and mean is not None else 1.0)
    return total


def _metric(doc: PatternsDoc, key: tuple[str, str]) -> tuple[str | None, float | None, int]:
    """Occurrence-weighted metric mean of the functions merged into `key`."""
    name, tot, w, occ = None, 0.0, 0.0, 0
    for f in doc.functions:
        if _key(f.category, f.name) != key:
            continue
        occ += f.occurrences_total
        if f.metric is not None and f.metric_mean is not None:
            name = f.metric.value
            tot += f.metric_mean * max(f.critical_seconds, 1e-9)
            w += max(f.critical_seconds, 1e-9)
    return name, (tot / w if w else None), occ


def _function_outliers(docs, rank, keys, row, fmed, fz, excess, ranks) -> list[Fact]:  # type: ignore[no-untyped-def]
    out: list[Fact] = []
    if excess <= 0:
        return out
    for j, k in enumerate(keys):
        if k[0] == Category.communication.value:
            continue
        fx = float(row[j] - fmed[j])
        explains = fx / excess
        if explains < FUNCTION_MIN_EXPLAINS or fz[j] < SUSPECT_Z:
            continue
        metric, mean, occ = _metric(docs[rank], k)
        peer_metrics = [_metric(docs[p], k) for p in ranks if p != rank]
        peer_vals = [m for _, m, _ in peer_metrics if m is not None]
        peer_occ = [o for _, _, o in peer_metrics]
        pmed = float(np.median(peer_vals)) if peer_vals else None
        mratio = None
        if mean is not None and pmed is not None and pmed > 0:
            mratio = round(min(mean / pmed, 1000.0), 4)
        out.append(
            FunctionOutlier(
                rank=rank, category=k[0], function=k[1],
                seconds_per_step=round(float(row[j]), 6),
                peer_median_seconds_per_step=round(float(fmed[j]), 6),
                excess_seconds_per_step=round(fx, 6),
                ratio_to_median=round(cap_ratio(float(row[j]), float(fmed[j])), 4),
                explains_ratio=round(min(explains, 1.0), 4),
                robust_z=round(float(min(fz[j], 1e6)), 3),
                metric=metric,
                metric_mean=None if mean is None else round(mean, 4),
                peer_metric_median=None if pmed is None else round(pmed, 4),
                metric_ratio_to_median=mratio,
                occurrences_total=occ,
                peer_median_occurrences=float(np.median(peer_occ)) if peer_occ else 0.0,
            )
        )
    return out


def _category_metric(doc: PatternsDoc, cat: str) -> float | None:
    tot = w = 0.0
    for f in doc.functions:
        if f.category.value == cat and f.metric_mean is not None and f.critical_seconds > 0:
            tot += f.metric_mean * f.critical_seconds
            w += f.critical_seconds
    return tot / w if w else None


def _category_excess(docs, rank, keys, fmat, fmed, i, excess, ranks, floor, clean) -> list[Fact]:  # type: ignore[no-untyped-def]
    """Per category: this rank's summed critical time vs the peers' reference of the sums
    (`fmed`: the per-function references already computed for this rank)."""
    out: list[Fact] = []
    if excess <= 0:
        return out
    row = fmat[i]
    for cat in sorted({k[0] for k in keys} - {Category.communication.value}):
        idx = [j for j, k in enumerate(keys) if k[0] == cat]
        sums = fmat[:, idx].sum(axis=1)
        mine = float(sums[i])
        med = _reference(sums, i, floor, clean)[0]
        cx = mine - med
        if cx / excess < FUNCTION_MIN_EXPLAINS:
            continue
        top = max(idx, key=lambda j: row[j] - fmed[j])
        m = _category_metric(docs[rank], cat)
        peer = [v for v in (_category_metric(docs[p], cat) for p in ranks if p != rank) if v is not None]
        pm = float(np.median(peer)) if peer else None
        out.append(
            CategoryExcess(
                rank=rank, category=cat,
                seconds_per_step=round(mine, 6), peer_median_seconds_per_step=round(med, 6),
                excess_seconds_per_step=round(cx, 6), explains_ratio=round(min(cx / excess, 1.0), 4),
                top_function=keys[top][1],
                metric_ratio_to_median=None if (m is None or not pm) else round(min(m / pm, 1000.0), 4),
            )
        )
    return out


def _config_deviations(docs: dict[int, PatternsDoc], rank: int, ranks: list[int]) -> list[Fact]:
    mine = {c.key: c.value for c in docs[rank].config}
    out: list[Fact] = []
    for key, val in sorted(mine.items()):
        if key in CONFIG_KEYS_IGNORED:
            continue
        others = [next((c.value for c in docs[p].config if c.key == key), None) for p in ranks if p != rank]
        others = [o for o in others if o is not None]
        if not others:
            continue
        majority = max(set(others), key=others.count)
        if others.count(majority) > len(others) / 2 and majority != val:
            out.append(ConfigDeviation(rank=rank, key=key, value=val, peer_value=majority))
    return out
