"""Peer comparison with robust statistics (pure numpy): per-rank patterns in, deviating facts out.

Synchronous collectives turn one late rank into waiting time on every other rank, so durations
of communication cannot name the culprit: the victims wait *longer* in communication and the
culprit waits *least*. We therefore compare each rank's *busy* time (step time minus time the
critical path spent waiting in communication) against the median of its peer group, and
attribute the excess to the functions that hold the critical path longer than on the peers.

The window is read into arrays once (engine/columns.py, engine/signals.SignalTable); every
statistic of a group is computed once over its members, and only the few suspects get facts, so
the rule engine sees deviations only, whatever the width of the job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from eroica.engine.columns import METRICS, WindowColumns, merged_key
from eroica.engine.facts import (
    CategoryExcess,
    ConfigDeviation,
    DeviceIdle,
    Fact,
    FunctionOutlier,
    RankSlowness,
    StepShare,
)
from eroica.engine.groups import peer_groups
from eroica.engine.links import link_facts
from eroica.engine.load import WindowData
from eroica.engine.robust import (
    MIN_GROUP,
    SUSPECT_EXCESS_STEP_RATIO,
    SUSPECT_Z,
    category_suspects,
    clean_members,
    paired_t,
    references,
)
from eroica.engine.signals import LARGE_GROUP, SignalTable, cap_ratio, host_cpu_facts, hw_signals, outlier_facts
from eroica.engine.spikes import SPIKE_SIGNALS, kept_steps, scheduled_steps, spike_facts
from eroica.engine.validity import validity
from eroica.schema.patterns import Category

SMALL_GROUP_MIN_RATIO = 1.1        # below 3 members: busy at least this much more than the other
SUSPECT_T = 4.0                    # or: excess consistent across the window's steps (paired t statistic)
FUNCTION_MIN_EXPLAINS = 0.1
CONFIG_KEYS_IGNORED = ("torch.version",)


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
    columns: WindowColumns | None = None
    signals: SignalTable | None = None


@dataclass
class GroupView:
    """One peer group's functions under their comparison keys (GC generations merged)."""

    ranks: list[int]
    rows: np.ndarray               # rows of the window's columns
    keys: list[tuple[str, str]]
    present: np.ndarray            # [n, K]
    per_step: np.ndarray           # [n, K, S] critical seconds per step, S = the members' fewest steps
    step: np.ndarray               # [n, S]
    metric_code: np.ndarray        # [n, K] -1 without a metric
    metric_mean: np.ndarray        # [n, K] critical-time-weighted over the merged functions, NaN without
    occurrences: np.ndarray        # [n, K]
    n_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))   # [n] steps each member's counts cover
    cat_metric: dict[str, np.ndarray] = field(default_factory=dict)   # [n] per category, NaN without
    nodes: list[tuple[tuple[str, int], ...]] = field(default_factory=list)   # [n] light windows' node counts
    node_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))   # [n] steps those counts cover


def group_view(cols: WindowColumns, ranks: list[int]) -> GroupView:
    rows = np.array([cols.row[r] for r in ranks], dtype=int)
    present_raw = cols.present[rows]
    merged: dict[tuple[str, str], list[int]] = {}
    for j in np.flatnonzero(present_raw.any(axis=0)):
        merged.setdefault(merged_key(*cols.keys[j]), []).append(int(j))
    keys = sorted(merged)
    n_steps = int(cols.n_steps[rows].min()) if len(rows) else 0
    n_steps = n_steps or 1
    n, nk = len(rows), len(keys)
    per_step = np.zeros((n, nk, n_steps))
    present = np.zeros((n, nk), dtype=bool)
    code = np.full((n, nk), -1, dtype=np.int16)
    wsum, w, occ = np.zeros((n, nk)), np.zeros((n, nk)), np.zeros((n, nk))
    sub = cols.per_step[rows][:, :, :n_steps]
    mc, mw, mws, mo = (a[rows] for a in (cols.metric_code, cols.metric_w, cols.metric_wsum, cols.occurrences))
    for k, key in enumerate(keys):
        idx = merged[key]
        per_step[:, k] = sub[:, idx].sum(axis=1)
        present[:, k] = present_raw[:, idx].any(axis=1)
        code[:, k] = mc[:, idx].max(axis=1)
        wsum[:, k] = mws[:, idx].sum(axis=1)
        w[:, k] = mw[:, idx].sum(axis=1)
        occ[:, k] = mo[:, idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(w > 0, wsum / np.where(w > 0, w, 1.0), np.nan)
    view = GroupView(ranks, rows, keys, present, per_step, cols.step[rows, :n_steps], code, mean, occ,
                     n_steps=cols.n_steps[rows].astype(float), nodes=[cols.autograd_nodes[r] for r in rows],
                     node_steps=cols.autograd_node_steps[rows])
    # the category's metric over its functions that held the critical path (critical-time-weighted)
    crit = cols.critical[rows]
    for cat in {k[0] for k in keys}:
        idx = [j for j, (c, _) in enumerate(cols.keys) if c.value == cat]
        m = (mc[:, idx] >= 0) & (crit[:, idx] > 0)
        cw = np.where(m, crit[:, idx], 0.0).sum(axis=1)
        cs = np.where(m, mws[:, idx], 0.0).sum(axis=1)
        view.cat_metric[cat] = np.where(cw > 0, cs / np.where(cw > 0, cw, 1.0), np.nan)
    return view


def _median_or_none(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else None


def analyze(window: WindowData) -> PeerAnalysis:
    cols = window.columns
    table = SignalTable(cols)
    facts: list[Fact] = []
    groups: list[PeerGroup] = []
    rows: dict[int, RankRow] = {}
    for grouping in peer_groups(cols):
        gname, ranks = grouping.name, grouping.ranks
        g = group_view(cols, ranks)
        keys, n = g.keys, len(ranks)
        comm_idx = [i for i, k in enumerate(keys) if k[0] == Category.communication.value]
        step = g.step
        comm_steps = g.per_step[:, comm_idx, :].sum(axis=1)
        busy_steps = np.maximum(step - comm_steps, 0.0)
        # a rare one-off spike step is reported on its own and left out of the comparison
        scheduled = scheduled_steps(g.per_step, keys)
        keep = kept_steps(step, scheduled)
        if not keep.all():
            hw = {s: (cols.per_step_signals[s][g.rows], cols.per_step_len[s][g.rows]) for s in SPIKE_SIGNALS}
            facts.extend(spike_facts(ranks, int(cols.start_step[g.rows].min()), step, busy_steps, keys, g.per_step,
                                     g.present, keep, hw))
        step, comm_steps, busy_steps = step[:, keep], comm_steps[:, keep], busy_steps[:, keep]
        # matrix [rank, key] of mean critical seconds per kept step
        fmat = g.per_step[:, :, keep].mean(axis=2)
        busy = busy_steps.mean(axis=1)
        comm = comm_steps.mean(axis=1)
        step_mean = step.mean(axis=1)
        med_step = float(np.median(step_mean))
        for i, r in enumerate(ranks):
            rows[r] = RankRow(r, float(step_mean[i]), float(busy[i]), float(comm[i]))
        floor = max(0.01 * med_step, 1e-4)
        clean = clean_members(busy, med_step, floor)
        cat_flag, cat_excess = category_suspects(keys, fmat, med_step, floor)
        if n >= MIN_GROUP and (~cat_flag).sum() >= max(n // 2, 1):
            clean &= ~cat_flag
        valid, reason, disp = validity(g, gname, grouping.how, fmat, busy, clean, floor)
        groups.append(PeerGroup(gname, ranks, valid, reason, round(disp, 4)))
        if not valid:   # no peers to compare with: state the step's make-up for expected-range rules
            facts.extend(step_shares(ranks, keys, fmat, step_mean))
        if n < 2:
            continue
        ref_clean = clean if n >= MIN_GROUP else None
        ref_busy, z = references(busy, floor, ref_clean)
        # a sparse category far above the peers is this rank's cost even if the rest of its step
        # happened to run faster (its own slowdown spread over the host)
        excess = np.maximum(busy - ref_busy, cat_excess)
        excess_ratio = excess / med_step if med_step > 0 else np.zeros(n)
        over = np.flatnonzero(excess_ratio >= SUSPECT_EXCESS_STEP_RATIO)
        # the per-step test only where the robust z alone does not decide
        weak = over[(z[over] < SUSPECT_Z) & ~cat_flag[over]]
        weak_t = dict(zip(weak.tolist(), paired_t(busy_steps, weak, clean, floor).tolist()))
        cands = [int(i) for i in over if weak_t.get(int(i), SUSPECT_T) >= SUSPECT_T]
        if n < MIN_GROUP:
            cands = [i for i in cands if cat_flag[i] or cap_ratio(float(busy[i]), float(ref_busy[i]))
                     >= SMALL_GROUP_MIN_RATIO]
        if cands:
            stats = GroupStats(gname, valid, keep, fmat, busy, busy_steps, comm, ref_busy, z, excess, excess_ratio,
                               clean, ref_clean, floor, [m[keep] for m in scheduled])
            facts.extend(_suspect_facts(cands, g, stats, table))
        suspects = {f.rank for f in facts if isinstance(f, RankSlowness) and f.group == gname}
        facts.extend(outlier_facts(table, ranks, keep, suspects, float(np.median(step))))
        facts.extend(link_facts(cols, ranks, {r: float(comm[i]) for i, r in enumerate(ranks)}))
    return PeerAnalysis(window.window_id, groups, facts, rows, cols, table)


@dataclass
class GroupStats:
    """One group's per-member numbers over the kept steps, and its references."""

    name: str
    valid: bool
    keep: np.ndarray            # [S] steps kept (a one-off spike left out)
    fmat: np.ndarray            # [n, K] critical seconds per step of each function
    busy: np.ndarray            # [n] busy seconds per step (step minus communication wait)
    busy_steps: np.ndarray      # [n, S]
    comm: np.ndarray            # [n] communication wait per step
    ref_busy: np.ndarray        # [n] each member's reference busy time
    z: np.ndarray               # [n] its robust z against it
    excess: np.ndarray          # [n] seconds per step above the reference
    excess_ratio: np.ndarray    # [n] that, as a share of the median step
    clean: np.ndarray           # [n] not a suspect
    ref_clean: np.ndarray | None   # the members references are taken over (None: fewer than MIN_GROUP)
    floor: float                # the smallest spread a z is measured in
    scheduled: list[np.ndarray] = field(default_factory=list)   # [S] masks: steps of each scheduled work


@dataclass
class CategoryRefs:
    """Per category (communication aside): its keys, each member's sum over them, the references."""

    idx: dict[str, list[int]]
    sums: dict[str, np.ndarray]
    refs: dict[str, np.ndarray]

    @classmethod
    def of(cls, keys: list[tuple[str, str]], fmat: np.ndarray, floor: float, clean: np.ndarray | None) -> CategoryRefs:
        cats = sorted({k[0] for k in keys} - {Category.communication.value})
        idx = {c: [j for j, k in enumerate(keys) if k[0] == c] for c in cats}
        sums = {c: fmat[:, ix].sum(axis=1) for c, ix in idx.items()}
        return cls(idx, sums, {c: references(v, floor, clean)[0] for c, v in sums.items()})


def _suspect_facts(cands: list[int], g: GroupView, st: GroupStats, table: SignalTable) -> list[Fact]:
    fmat, busy, busy_steps, comm, ref_busy, clean = st.fmat, st.busy, st.busy_steps, st.comm, st.ref_busy, st.clean
    n = len(g.ranks)
    out: list[Fact] = []
    min_comm = float(comm.min())
    med_comm = float(np.median(comm[clean]))
    med_busy_steps = np.median(busy_steps[clean] if clean.any() else busy_steps, axis=0)
    fmed_all, fz_all = references(fmat, st.floor, st.ref_clean)
    cats = CategoryRefs.of(g.keys, fmat, st.floor, st.ref_clean)
    large = n >= LARGE_GROUP
    hw_medians: dict[str, float | None] | None = {} if large else None
    votes = _ConfigVotes(table.cols, g, clean)
    clean_rows = g.rows[clean]
    for i in cands:
        r = g.ranks[i]
        ex = float(st.excess[i])
        slow_steps = busy_steps[i] > med_busy_steps + 0.5 * ex
        consistency = float(np.mean(slow_steps))
        over = np.maximum(busy_steps[i] - med_busy_steps, 0.0)
        for sched in st.scheduled:
            # excess that sits in the steps of one scheduled work (a slow checkpoint) is judged by them
            if ex > 0 and sched.any() and float(over[sched].sum()) >= 0.8 * float(over.sum()):
                consistency = float(np.mean(over[sched] > 0.5 * ex))
                break
        out.append(
            RankSlowness(
                rank=r, group=st.name,
                busy_seconds_per_step=round(float(busy[i]), 6),
                peer_median_busy_seconds_per_step=round(float(ref_busy[i]), 6),
                excess_seconds_per_step=round(ex, 6),
                excess_step_ratio=round(float(st.excess_ratio[i]), 4),
                busy_ratio_to_median=round(cap_ratio(float(busy[i]), float(ref_busy[i])), 4),
                comm_wait_ratio_to_median=round(cap_ratio(float(comm[i]), med_comm), 4),
                least_waiting=bool(comm[i] <= min_comm + 1e-9),
                robust_z=round(float(min(st.z[i], 1e6)), 3),
                consistency_ratio=round(consistency, 4),
                peers=n, group_valid=st.valid,
            )
        )
        others = np.arange(n) != i
        out.extend(_function_outliers(g, i, fmat[i], fmed_all[i], fz_all[i], ex, others))
        out.extend(_category_excess(g, i, fmat[i], fmed_all[i], ex, cats, others))
        out.extend(_device_idle(g, i, fmat[i], fmed_all[i], ex, cats, float(np.median(g.step[i]))))
        peers = g.rows[clean & others]
        if not len(peers):
            peers = g.rows[others]
        if large:          # one peer set serves every suspect of a large group
            peers = clean_rows
        out.extend(hw_signals(table, r, peers, st.keep, medians=hw_medians))
        out.extend(host_cpu_facts(table, r, st.keep))
        out.extend(votes.deviations(i))
    return out


SHARE_CATEGORIES = (Category.data.value, Category.gc.value, Category.region.value, Category.memory.value)
MIN_SHARE = 0.05


def step_shares(ranks: list[int], keys: list[tuple[str, str]], fmat: np.ndarray, step: np.ndarray) -> list[Fact]:
    out: list[Fact] = []
    idx = {cat: [j for j, k in enumerate(keys) if k[0] == cat] for cat in SHARE_CATEGORIES}
    sec = {cat: fmat[:, ix].sum(axis=1) if ix else np.zeros(len(ranks)) for cat, ix in idx.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        share = {cat: np.where(step > 0, s / np.where(step > 0, step, 1.0), 0.0) for cat, s in sec.items()}
    hit = {cat: (step > 0) & (share[cat] >= MIN_SHARE) for cat in SHARE_CATEGORIES}
    for i in np.flatnonzero(np.any([hit[c] for c in SHARE_CATEGORIES], axis=0)):
        for cat in SHARE_CATEGORIES:
            if not hit[cat][i]:
                continue
            ix = idx[cat]
            top = keys[ix[int(np.argmax(fmat[i, ix]))]][1]
            out.append(StepShare(rank=ranks[i], category=cat, share_ratio=round(min(float(share[cat][i]), 1.0), 4),
                                 seconds_per_step=round(float(sec[cat][i]), 6), top_function=top, group_valid=False))
    return out


def _function_outliers(g: GroupView, i: int, row: np.ndarray, fmed: np.ndarray, fz: np.ndarray, excess: float,
                       others: np.ndarray) -> list[Fact]:
    out: list[Fact] = []
    if excess <= 0:
        return out
    for j, k in enumerate(g.keys):
        if k[0] == Category.communication.value:
            continue
        fx = float(row[j] - fmed[j])
        explains = fx / excess
        if explains < FUNCTION_MIN_EXPLAINS or fz[j] < SUSPECT_Z:
            continue
        code, mean = int(g.metric_code[i, j]), g.metric_mean[i, j]
        metric = METRICS[code].value if code >= 0 else None
        mean_v = None if np.isnan(mean) else float(mean)
        pmed = _median_or_none(g.metric_mean[others, j])
        mratio = None
        if mean_v is not None and pmed is not None and pmed > 0:
            mratio = round(min(mean_v / pmed, 1000.0), 4)
        peer_occ = g.occurrences[others, j]
        out.append(
            FunctionOutlier(
                rank=g.ranks[i], category=k[0], function=k[1],
                seconds_per_step=round(float(row[j]), 6),
                peer_median_seconds_per_step=round(float(fmed[j]), 6),
                excess_seconds_per_step=round(fx, 6),
                ratio_to_median=round(cap_ratio(float(row[j]), float(fmed[j])), 4),
                explains_ratio=round(min(explains, 1.0), 4),
                robust_z=round(float(min(fz[j], 1e6)), 3),
                metric=metric,
                metric_mean=None if mean_v is None else round(mean_v, 4),
                peer_metric_median=None if pmed is None else round(pmed, 4),
                metric_ratio_to_median=mratio,
                occurrences_total=int(g.occurrences[i, j]),
                peer_median_occurrences=float(np.median(peer_occ)) if len(peer_occ) else 0.0,
            )
        )
    return out


def _category_excess(g: GroupView, i: int, row: np.ndarray, fmed: np.ndarray, excess: float, cats: CategoryRefs,
                     others: np.ndarray) -> list[Fact]:
    """Per category: this rank's summed critical time vs the peers' reference of the sums
    (`fmed`: the per-function references of this rank)."""
    out: list[Fact] = []
    if excess <= 0:
        return out
    for cat, idx in cats.idx.items():
        mine = float(cats.sums[cat][i])
        med = float(cats.refs[cat][i])
        cx = mine - med
        if cx / excess < FUNCTION_MIN_EXPLAINS:
            continue
        top = idx[int(np.argmax((row - fmed)[idx]))]
        m = g.cat_metric[cat][i]
        pm = _median_or_none(g.cat_metric[cat][others])
        out.append(
            CategoryExcess(
                rank=g.ranks[i], category=cat,
                seconds_per_step=round(mine, 6), peer_median_seconds_per_step=round(med, 6),
                excess_seconds_per_step=round(cx, 6), explains_ratio=round(min(cx / excess, 1.0), 4),
                top_function=g.keys[top][1],
                metric_ratio_to_median=None if (np.isnan(m) or not pm) else round(min(float(m) / pm, 1000.0), 4),
            )
        )
    return out


DEVICE_KINDS = (Category.kernel.value, Category.memory.value, Category.communication.value)


def _device_idle(g: GroupView, i: int, row: np.ndarray, fmed: np.ndarray, excess: float, cats: CategoryRefs,
                 step: float) -> list[Fact]:
    """On a device rank (its group runs kernels), the host-side work that held the critical path
    while the device idled (device_first attribution), against the peers' references."""
    if excess <= 0 or not any(k[0] == Category.kernel.value for k in g.keys):
        return []
    host = [c for c in cats.idx if c not in DEVICE_KINDS]
    if not host:
        return []
    mine = sum(float(cats.sums[c][i]) for c in host)
    ref = sum(float(cats.refs[c][i]) for c in host)
    top_cat = max(host, key=lambda c: float(cats.sums[c][i] - cats.refs[c][i]))
    idx = cats.idx[top_cat]
    top = idx[int(np.argmax((row - fmed)[idx]))]
    return [DeviceIdle(
        rank=g.ranks[i], seconds_per_step=round(mine, 6), peer_median_seconds_per_step=round(ref, 6),
        excess_seconds_per_step=round(mine - ref, 6),
        explains_ratio=round(float(np.clip((mine - ref) / excess, 0.0, 1.0)), 4),
        idle_ratio_of_step=round(float(np.clip(mine / step, 0.0, 1.0)) if step > 0 else 0.0, 4),
        top_category=top_cat, top_function=g.keys[top][1])]


class _ConfigVotes:
    """The peers' majority value of each setting, counted once per group: a suspect is compared with
    the clean members other than itself (all the others when none of them is clean)."""

    def __init__(self, cols: WindowColumns, g: GroupView, clean: np.ndarray) -> None:
        self.ranks, self.clean = g.ranks, clean
        self.cfg: list[dict[str, str]] = []
        for i in g.rows:
            c: dict[str, str] = {}
            for key, value in cols.config[i]:
                c.setdefault(key, value)
            self.cfg.append(c)
        self.clean_votes: dict[str, Counter[str]] = {}
        for j in np.flatnonzero(clean):
            for key, val in self.cfg[j].items():
                self.clean_votes.setdefault(key, Counter())[val] += 1

    def deviations(self, i: int) -> list[Fact]:
        mine = self.cfg[i]
        n = len(self.ranks)
        others_clean = int(self.clean.sum()) - int(self.clean[i])
        out: list[Fact] = []
        for key, val in sorted(mine.items()):
            if key in CONFIG_KEYS_IGNORED or key.startswith("site."):   # where code is, not how it runs
                continue
            if others_clean:
                votes = Counter(self.clean_votes.get(key, Counter()))
                if self.clean[i]:
                    votes[val] -= 1
            else:
                votes = Counter(self.cfg[j][key] for j in range(n) if j != i and key in self.cfg[j])
            votes = +votes
            total = sum(votes.values())
            if not total:
                continue
            majority, count = votes.most_common(1)[0]
            if count > total / 2 and majority != val:
                out.append(ConfigDeviation(rank=self.ranks[i], key=key, value=val, peer_value=majority))
        return out
