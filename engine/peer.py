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
from eroica.schema.diagnosis import WindowHistory
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
    summary: WindowHistory | None = None   # what a later window needs of this one (findings: once ruled)


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
    rows = np.array([cols.row[rank] for rank in ranks], dtype=int)
    present_raw = cols.present[rows]
    merged: dict[tuple[str, str], list[int]] = {}
    for col in np.flatnonzero(present_raw.any(axis=0)):
        merged.setdefault(merged_key(*cols.keys[col]), []).append(int(col))
    keys = sorted(merged)
    n_steps = int(cols.n_steps[rows].min()) if len(rows) else 0
    n_steps = n_steps or 1
    shape = (len(rows), len(keys))
    per_step = np.zeros((*shape, n_steps))
    present = np.zeros(shape, dtype=bool)
    code = np.full(shape, -1, dtype=np.int16)
    weighted_sum, weight, occurrences = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    member_steps = cols.per_step[rows][:, :, :n_steps]
    metric_code, metric_w, metric_wsum, member_occ = (
        a[rows] for a in (cols.metric_code, cols.metric_w, cols.metric_wsum, cols.occurrences))
    for k, key in enumerate(keys):
        merged_cols = merged[key]
        per_step[:, k] = member_steps[:, merged_cols].sum(axis=1)
        present[:, k] = present_raw[:, merged_cols].any(axis=1)
        code[:, k] = metric_code[:, merged_cols].max(axis=1)
        weighted_sum[:, k] = metric_wsum[:, merged_cols].sum(axis=1)
        weight[:, k] = metric_w[:, merged_cols].sum(axis=1)
        occurrences[:, k] = member_occ[:, merged_cols].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(weight > 0, weighted_sum / np.where(weight > 0, weight, 1.0), np.nan)
    view = GroupView(ranks, rows, keys, present, per_step, cols.step[rows, :n_steps], code, mean, occurrences,
                     n_steps=cols.n_steps[rows].astype(float), nodes=[cols.autograd_nodes[row] for row in rows],
                     node_steps=cols.autograd_node_steps[rows])
    # the category's metric over its functions that held the critical path (critical-time-weighted)
    critical = cols.critical[rows]
    for cat in {k[0] for k in keys}:
        cat_cols = [col for col, (c, _) in enumerate(cols.keys) if c.value == cat]
        measured = (metric_code[:, cat_cols] >= 0) & (critical[:, cat_cols] > 0)
        crit_sum = np.where(measured, critical[:, cat_cols], 0.0).sum(axis=1)
        metric_sum = np.where(measured, metric_wsum[:, cat_cols], 0.0).sum(axis=1)
        view.cat_metric[cat] = np.where(crit_sum > 0, metric_sum / np.where(crit_sum > 0, crit_sum, 1.0), np.nan)
    return view


def _median_or_none(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.median(values)) if len(values) else None


def analyze(window: WindowData) -> PeerAnalysis:
    cols = window.columns
    table = SignalTable(cols)
    facts: list[Fact] = []
    groups: list[PeerGroup] = []
    rows: dict[int, RankRow] = {}
    for grouping in peer_groups(cols):
        gname, ranks = grouping.name, grouping.ranks
        view = group_view(cols, ranks)
        keys, size = view.keys, len(ranks)
        comm_keys = [k for k, key in enumerate(keys) if key[0] == Category.communication.value]
        step = view.step
        comm_steps = view.per_step[:, comm_keys, :].sum(axis=1)
        busy_steps = np.maximum(step - comm_steps, 0.0)
        # a rare one-off spike step is reported on its own and left out of the comparison
        scheduled = scheduled_steps(view.per_step, keys)
        keep = kept_steps(step, scheduled)
        if not keep.all():
            hw = {s: (cols.per_step_signals[s][view.rows], cols.per_step_len[s][view.rows]) for s in SPIKE_SIGNALS}
            facts.extend(spike_facts(ranks, int(cols.start_step[view.rows].min()), step, busy_steps, keys,
                                     per_step=view.per_step, present=view.present, keep=keep, per_step_hw=hw))
        step, comm_steps, busy_steps = step[:, keep], comm_steps[:, keep], busy_steps[:, keep]
        # matrix [member, key] of mean critical seconds per kept step
        fmat = view.per_step[:, :, keep].mean(axis=2)
        busy = busy_steps.mean(axis=1)
        comm = comm_steps.mean(axis=1)
        step_mean = step.mean(axis=1)
        med_step = float(np.median(step_mean))
        for member, rank in enumerate(ranks):
            rows[rank] = RankRow(rank, float(step_mean[member]), float(busy[member]), float(comm[member]))
        floor = max(0.01 * med_step, 1e-4)
        clean = clean_members(busy, med_step, floor)
        cat_flag, cat_excess = category_suspects(keys, fmat, med_step, floor)
        if size >= MIN_GROUP and (~cat_flag).sum() >= max(size // 2, 1):
            clean &= ~cat_flag
        valid, reason, dispersion = validity(view, gname, grouping.how, fmat=fmat, busy=busy, clean=clean,
                                             floor=floor)
        groups.append(PeerGroup(gname, ranks, valid, reason, round(dispersion, 4)))
        if not valid:   # no peers to compare with: state the step's make-up for expected-range rules
            facts.extend(step_shares(ranks, keys, fmat, step_mean))
        if size < 2:
            continue
        ref_clean = clean if size >= MIN_GROUP else None
        ref_busy, busy_z = references(busy, floor, ref_clean)
        # a sparse category far above the peers is this rank's cost even if the rest of its step
        # happened to run faster (its own slowdown spread over the host)
        excess = np.maximum(busy - ref_busy, cat_excess)
        excess_ratio = excess / med_step if med_step > 0 else np.zeros(size)
        over = np.flatnonzero(excess_ratio >= SUSPECT_EXCESS_STEP_RATIO)
        # the per-step test only where the robust z alone does not decide
        weak = over[(busy_z[over] < SUSPECT_Z) & ~cat_flag[over]]
        weak_t = dict(zip(weak.tolist(), paired_t(busy_steps, weak, clean, floor).tolist()))
        candidates = [int(m) for m in over if weak_t.get(int(m), SUSPECT_T) >= SUSPECT_T]
        if size < MIN_GROUP:
            candidates = [m for m in candidates if cat_flag[m] or cap_ratio(float(busy[m]), float(ref_busy[m]))
                          >= SMALL_GROUP_MIN_RATIO]
        if candidates:
            stats = GroupStats(gname, valid, keep, fmat, busy, busy_steps, comm, ref_busy, busy_z, excess,
                               excess_ratio, clean, ref_clean, floor, [m[keep] for m in scheduled])
            facts.extend(_suspect_facts(candidates, view, stats, table))
        suspects = {f.rank for f in facts if isinstance(f, RankSlowness) and f.group == gname}
        facts.extend(outlier_facts(table, ranks, keep, suspects, float(np.median(step))))
        facts.extend(link_facts(cols, ranks, {rank: float(comm[m]) for m, rank in enumerate(ranks)}))
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


@dataclass(frozen=True)
class Suspect:
    """One candidate member of a group and what its per-function comparisons read."""

    member: int                 # its index in the group
    rank: int
    seconds: np.ndarray         # [K] its critical seconds per step of each function
    reference: np.ndarray       # [K] the peers' reference of each
    z: np.ndarray               # [K] its robust z against that reference
    excess_seconds: float       # its busy seconds per step above its reference
    others: np.ndarray          # [n] mask of the other members


def _suspect_facts(candidates: list[int], view: GroupView, st: GroupStats, table: SignalTable) -> list[Fact]:
    busy_steps, comm, clean = st.busy_steps, st.comm, st.clean
    size = len(view.ranks)
    out: list[Fact] = []
    min_comm = float(comm.min())
    med_comm = float(np.median(comm[clean]))
    med_busy_steps = np.median(busy_steps[clean] if clean.any() else busy_steps, axis=0)
    fn_reference, fn_z = references(st.fmat, st.floor, st.ref_clean)
    cats = CategoryRefs.of(view.keys, st.fmat, st.floor, st.ref_clean)
    large = size >= LARGE_GROUP
    hw_medians: dict[str, float | None] | None = {} if large else None
    votes = _ConfigVotes(table.cols, view, clean)
    clean_rows = view.rows[clean]
    for member in candidates:
        rank = view.ranks[member]
        excess = float(st.excess[member])
        slow_steps = busy_steps[member] > med_busy_steps + 0.5 * excess
        consistency = float(np.mean(slow_steps))
        over = np.maximum(busy_steps[member] - med_busy_steps, 0.0)
        for sched in st.scheduled:
            # excess that sits in the steps of one scheduled work (a slow checkpoint) is judged by them
            if excess > 0 and sched.any() and float(over[sched].sum()) >= 0.8 * float(over.sum()):
                consistency = float(np.mean(over[sched] > 0.5 * excess))
                break
        busy, ref_busy = float(st.busy[member]), float(st.ref_busy[member])
        out.append(
            RankSlowness(
                rank=rank, group=st.name,
                busy_seconds_per_step=round(busy, 6),
                peer_median_busy_seconds_per_step=round(ref_busy, 6),
                excess_seconds_per_step=round(excess, 6),
                # a share of the job's step: the others wait for the excess, so it is part of their step
                excess_step_ratio=round(float(np.clip(st.excess_ratio[member], 0.0, 1.0)), 4),
                busy_ratio_to_median=round(cap_ratio(busy, ref_busy), 4),
                comm_wait_ratio_to_median=round(cap_ratio(float(comm[member]), med_comm), 4),
                least_waiting=bool(comm[member] <= min_comm + 1e-9),
                robust_z=round(float(min(st.z[member], 1e6)), 3),
                consistency_ratio=round(consistency, 4),
                peers=size, group_valid=st.valid,
            )
        )
        others = np.arange(size) != member
        suspect = Suspect(member, rank, st.fmat[member], fn_reference[member], fn_z[member], excess, others)
        out.extend(_function_outliers(view, suspect))
        out.extend(_category_excess(view, suspect, cats))
        out.extend(_device_idle(view, suspect, cats))
        peers = view.rows[clean & others]
        if not len(peers):
            peers = view.rows[others]
        if large:          # one peer set serves every suspect of a large group
            peers = clean_rows
        out.extend(hw_signals(table, rank, peers, st.keep, medians=hw_medians))
        out.extend(host_cpu_facts(table, rank, st.keep))
        out.extend(votes.deviations(member))
    return out


SHARE_CATEGORIES = (Category.data.value, Category.gc.value, Category.region.value, Category.memory.value)
MIN_SHARE = 0.05


def step_shares(ranks: list[int], keys: list[tuple[str, str]], fmat: np.ndarray, step: np.ndarray) -> list[Fact]:
    """What each member's step is made of (`fmat`: [member, key] seconds per step; `step`: [member]
    step seconds), per host-side category holding at least MIN_SHARE of it."""
    out: list[Fact] = []
    cat_keys = {cat: [k for k, key in enumerate(keys) if key[0] == cat] for cat in SHARE_CATEGORIES}
    seconds = {cat: fmat[:, ks].sum(axis=1) if ks else np.zeros(len(ranks)) for cat, ks in cat_keys.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        share = {cat: np.where(step > 0, sec / np.where(step > 0, step, 1.0), 0.0) for cat, sec in seconds.items()}
    hit = {cat: (step > 0) & (share[cat] >= MIN_SHARE) for cat in SHARE_CATEGORIES}
    for member in np.flatnonzero(np.any([hit[c] for c in SHARE_CATEGORIES], axis=0)):
        for cat in SHARE_CATEGORIES:
            if not hit[cat][member]:
                continue
            ks = cat_keys[cat]
            top = keys[ks[int(np.argmax(fmat[member, ks]))]][1]
            out.append(StepShare(rank=ranks[member], category=cat,
                                 share_ratio=round(min(float(share[cat][member]), 1.0), 4),
                                 seconds_per_step=round(float(seconds[cat][member]), 6), top_function=top,
                                 group_valid=False))
    return out


def _function_outliers(view: GroupView, suspect: Suspect) -> list[Fact]:
    out: list[Fact] = []
    if suspect.excess_seconds <= 0:
        return out
    member, others = suspect.member, suspect.others
    for k, (category, function) in enumerate(view.keys):
        if category == Category.communication.value:
            continue
        mine, reference = float(suspect.seconds[k]), float(suspect.reference[k])
        fn_excess = mine - reference
        explains = fn_excess / suspect.excess_seconds
        if explains < FUNCTION_MIN_EXPLAINS or suspect.z[k] < SUSPECT_Z:
            continue
        code, mean = int(view.metric_code[member, k]), view.metric_mean[member, k]
        metric = METRICS[code].value if code >= 0 else None
        metric_mean = None if np.isnan(mean) else float(mean)
        peer_metric = _median_or_none(view.metric_mean[others, k])
        metric_ratio = None
        if metric_mean is not None and peer_metric is not None and peer_metric > 0:
            metric_ratio = round(min(metric_mean / peer_metric, 1000.0), 4)
        peer_occ = view.occurrences[others, k]
        out.append(
            FunctionOutlier(
                rank=suspect.rank, category=category, function=function,
                seconds_per_step=round(mine, 6),
                peer_median_seconds_per_step=round(reference, 6),
                excess_seconds_per_step=round(fn_excess, 6),
                ratio_to_median=round(cap_ratio(mine, reference), 4),
                explains_ratio=round(min(explains, 1.0), 4),
                robust_z=round(float(min(suspect.z[k], 1e6)), 3),
                metric=metric,
                metric_mean=None if metric_mean is None else round(metric_mean, 4),
                peer_metric_median=None if peer_metric is None else round(peer_metric, 4),
                metric_ratio_to_median=metric_ratio,
                occurrences_total=int(view.occurrences[member, k]),
                peer_median_occurrences=float(np.median(peer_occ)) if len(peer_occ) else 0.0,
            )
        )
    return out


def _category_excess(view: GroupView, suspect: Suspect, cats: CategoryRefs) -> list[Fact]:
    """Per category: this rank's summed critical time vs the peers' reference of the sums; the
    function named is the one of the category furthest above its own reference."""
    out: list[Fact] = []
    if suspect.excess_seconds <= 0:
        return out
    member = suspect.member
    above = suspect.seconds - suspect.reference
    for cat, cat_keys in cats.idx.items():
        mine = float(cats.sums[cat][member])
        reference = float(cats.refs[cat][member])
        cat_excess = mine - reference
        if cat_excess / suspect.excess_seconds < FUNCTION_MIN_EXPLAINS:
            continue
        top = cat_keys[int(np.argmax(above[cat_keys]))]
        metric = view.cat_metric[cat][member]
        peer_metric = _median_or_none(view.cat_metric[cat][suspect.others])
        out.append(
            CategoryExcess(
                rank=suspect.rank, category=cat,
                seconds_per_step=round(mine, 6), peer_median_seconds_per_step=round(reference, 6),
                excess_seconds_per_step=round(cat_excess, 6),
                explains_ratio=round(min(cat_excess / suspect.excess_seconds, 1.0), 4),
                top_function=view.keys[top][1],
                metric_ratio_to_median=(None if (np.isnan(metric) or not peer_metric)
                                        else round(min(float(metric) / peer_metric, 1000.0), 4)),
                ratio_to_median=(round(min(mine / reference, 1000.0), 4) if reference > 0
                                 else (1000.0 if mine > 0 else 1.0)),
            )
        )
    return out


DEVICE_KINDS = (Category.kernel.value, Category.memory.value, Category.communication.value)


def _device_idle(view: GroupView, suspect: Suspect, cats: CategoryRefs) -> list[Fact]:
    """On a device rank (its group runs kernels), the host-side work that held the critical path
    while the device idled (device_first attribution), against the peers' references."""
    if suspect.excess_seconds <= 0 or not any(k[0] == Category.kernel.value for k in view.keys):
        return []
    host = [c for c in cats.idx if c not in DEVICE_KINDS]
    if not host:
        return []
    member = suspect.member
    step = float(np.median(view.step[member]))
    mine = sum(float(cats.sums[c][member]) for c in host)
    reference = sum(float(cats.refs[c][member]) for c in host)
    top_cat = max(host, key=lambda c: float(cats.sums[c][member] - cats.refs[c][member]))
    cat_keys = cats.idx[top_cat]
    top = cat_keys[int(np.argmax((suspect.seconds - suspect.reference)[cat_keys]))]
    return [DeviceIdle(
        rank=suspect.rank, seconds_per_step=round(mine, 6), peer_median_seconds_per_step=round(reference, 6),
        excess_seconds_per_step=round(mine - reference, 6),
        explains_ratio=round(float(np.clip((mine - reference) / suspect.excess_seconds, 0.0, 1.0)), 4),
        idle_ratio_of_step=round(float(np.clip(mine / step, 0.0, 1.0)) if step > 0 else 0.0, 4),
        top_category=top_cat, top_function=view.keys[top][1])]


class _ConfigVotes:
    """The peers' majority value of each setting, counted once per group: a suspect is compared with
    the clean members other than itself (all the others when none of them is clean)."""

    def __init__(self, cols: WindowColumns, view: GroupView, clean: np.ndarray) -> None:
        self.ranks, self.clean = view.ranks, clean
        self.cfg: list[dict[str, str]] = []
        for row in view.rows:
            settings: dict[str, str] = {}
            for key, value in cols.config[row]:
                settings.setdefault(key, value)
            self.cfg.append(settings)
        self.clean_votes: dict[str, Counter[str]] = {}
        for member in np.flatnonzero(clean):
            for key, value in self.cfg[member].items():
                self.clean_votes.setdefault(key, Counter())[value] += 1

    def deviations(self, member: int) -> list[Fact]:
        mine = self.cfg[member]
        others_clean = int(self.clean.sum()) - int(self.clean[member])
        out: list[Fact] = []
        for key, value in sorted(mine.items()):
            if key in CONFIG_KEYS_IGNORED or key.startswith("site."):   # where code is, not how it runs
                continue
            if others_clean:
                votes = Counter(self.clean_votes.get(key, Counter()))
                if self.clean[member]:
                    votes[value] -= 1
            else:
                votes = Counter(cfg[key] for other, cfg in enumerate(self.cfg) if other != member and key in cfg)
            votes = +votes
            total = sum(votes.values())
            if not total:
                continue
            majority, count = votes.most_common(1)[0]
            if count > total / 2 and majority != value:
                out.append(ConfigDeviation(rank=self.ranks[member], key=key, value=value, peer_value=majority))
        return out
