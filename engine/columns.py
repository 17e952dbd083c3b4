"""A window's pattern documents as arrays, read in one pass.

Every per-rank number the engine and the report use (critical seconds per step of each function,
its metric, the hardware signals, step times, what each rank is and where it runs, what its
collector cost) is extracted from each validated document as it is loaded and laid out as arrays
over the ranks. The documents themselves need not stay in memory: a 100,000-rank window is a few
hundred MB of arrays, not 100,000 object trees, and comparing the ranks is a few array operations.
Rows follow the sorted rank ids; a missing value is NaN, never a silent 0.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from eroica.engine.groups import op_set, partition
from eroica.engine.links import link_signature, own_link
from eroica.engine.signals import GPU_SIGNALS, HW_SIGNALS
from eroica.schema.patterns import PER_STEP_SIGNALS, Category, MetricName, PatternsDoc

METRICS = list(MetricName)
METRIC_CODE = {m: i for i, m in enumerate(METRICS)}
#: the whole-window signals kept per rank: those compared with peers, and the host's CPU use
SIGNALS = (*HW_SIGNALS, *GPU_SIGNALS, "system_cpu_util_ratio")
FN_FIELDS = ("row", "col", "off", "len", "code", "crit", "occ", "wsum", "w", "mean", "std")
OVERHEAD_FIELDS = ("detector_seconds_total", "detector_calls_total", "sampler_cpu_seconds", "summarize_seconds",
                   "raw_events_total", "pattern_bytes")


def merged_key(cat: Category, name: str) -> tuple[str, str]:
    """The key a function is compared under: GC generations are one function (peers collect
    young generations too)."""
    if cat == Category.gc:
        return ("gc", "gc.collect")
    return (cat.value, name)


def _num(v: float | None) -> float:
    return np.nan if v is None else float(v)


@dataclass
class WindowColumns:
    """One window, one row per rank (sorted). Functions are keyed by (category, name) as written."""

    ranks: list[int]
    row: dict[int, int]
    # functions: [R, F] and [R, F, S]
    keys: list[tuple[Category, str]]
    n_steps: np.ndarray        # [R] the rank's own number of window steps
    step: np.ndarray           # [R, S] step seconds, 0 past a rank's own steps
    per_step: np.ndarray       # [R, F, S] critical seconds per step (the total spread evenly where a
    #                            function has no per-step list of the rank's step count)
    present: np.ndarray        # [R, F] the rank reported the function
    critical: np.ndarray       # [R, F] critical seconds over the window
    occurrences: np.ndarray    # [R, F]
    metric_code: np.ndarray    # [R, F] index into METRICS, -1 without a metric mean
    metric_wsum: np.ndarray    # [R, F] metric mean x max(critical, 1e-9)
    metric_w: np.ndarray       # [R, F] max(critical, 1e-9) where a metric mean exists
    metric_mean: np.ndarray    # [R, F] of the first such function, NaN without one
    metric_std: np.ndarray     # [R, F] likewise
    # hardware
    signals: dict[str, np.ndarray]            # whole-window value [R] of each of SIGNALS
    per_step_signals: dict[str, np.ndarray]   # [R, S'] the collector's per-step values (NaN: none)
    per_step_len: dict[str, np.ndarray]       # [R] length of each rank's per-step list (0: none)
    cores: np.ndarray          # [R] cores of the host (per-core samples)
    own_link: np.ndarray       # [R] traffic over an interface of its own
    link: np.ndarray           # [R, 3] communication byte rate: mean, spread / mean, share of the window
    link_top: list[str]        # [R] top communication function
    # what each rank is
    hostname: list[str]
    role: list[str]
    partition: list[str]       # position in pipeline / expert process groups ("" if none)
    ops: np.ndarray            # [R] index into op_sets: the compute / kernel / memory ops it runs
    op_sets: list[frozenset[str]]
    world_size: np.ndarray     # [R]
    start_step: np.ndarray     # [R]
    end_step: np.ndarray       # [R]
    trigger: list[str]
    baseline: np.ndarray       # [R] step time before the window (NaN: none)
    before: np.ndarray         # [R, B] steps before the window, right-aligned, NaN-padded on the left
    before_len: np.ndarray     # [R]
    config: list[tuple[tuple[str, str], ...]]
    config_since: list[tuple[tuple[str, int], ...]]   # [R] the step each setting took its value, where recorded
    gaps: list[tuple[tuple[str, str], ...]]
    overhead: dict[str, np.ndarray]           # [R] per OVERHEAD_FIELDS
    privacy: list[str]
    autograd_nodes: list[tuple[tuple[str, int], ...]]   # [R] a light window's node counts by type (): none
    autograd_node_steps: np.ndarray           # [R] the window steps those counts cover
    device: list[str] = field(default_factory=list)   # [R] the rank's device ("cuda:3"; "cpu")

    def hosts(self) -> dict[str, np.ndarray]:
        out: dict[str, list[int]] = {}
        for i, h in enumerate(self.hostname):
            out.setdefault(h, []).append(i)
        return {h: np.array(v, dtype=int) for h, v in out.items()}


class ColumnsBuilder:
    """Accumulates one document at a time (in any rank order) in compact arrays; `build()` sorts."""

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.index: dict[tuple[Category, str], int] = {}
        self.op_index: dict[frozenset[str], int] = {}
        # one row per function: FN_FIELDS, converted to arrays in chunks (bounded transient memory)
        self.fn_rows: list[tuple[float, ...]] = []
        self.fn_chunks: list[np.ndarray] = []
        self.fn_vals = array("d")
        self.steps = array("d")
        self.step_len = array("q")
        self.before = array("d")
        self.before_len = array("q")
        self.sig = array("d")
        self.ps_vals = array("d")
        self.ps_meta = array("q")              # (row, signal, length, offset) per kept per-step list
        self.scalars = {k: array("d") for k in ("baseline", "cores", "own", "lmean", "lcv", "lshare",
                                                 "world", "start", "end", "node_steps",
                                                 *OVERHEAD_FIELDS)}
        self.text: dict[str, list[Any]] = {k: [] for k in ("host", "device", "role", "part", "trigger", "top",
                                                           "config", "since", "gaps", "privacy", "nodes")}
        self.ops = array("q")

    def add(self, d: PatternsDoc) -> None:
        i = len(self.ranks)
        self.ranks.append(d.job.rank)
        dur = d.step_times.during_seconds
        n = len(dur)
        self.steps.extend(dur)
        self.step_len.append(n)
        self.before.extend(d.step_times.before_seconds)
        self.before_len.append(len(d.step_times.before_seconds))
        index, vals, rows = self.index, self.fn_vals, self.fn_rows
        for f in d.functions:
            j = index.setdefault((f.category, f.name), len(index))
            v = f.critical_per_step_seconds
            off = len(vals)
            crit = f.critical_seconds
            if len(v) == n and n > 0:
                vals.extend(v)
                m = n
            else:
                m = max(n, 1)
                vals.extend([crit / m] * m)
            mean = f.metric_mean
            if f.metric is not None and mean is not None:
                wt = max(crit, 1e-9)
                std = f.metric_std
                rows.append((i, j, off, m, METRIC_CODE[f.metric], crit, f.occurrences_total, mean * wt, wt, mean,
                             np.nan if std is None else std))
            else:
                rows.append((i, j, off, m, -1, crit, f.occurrences_total, 0.0, 0.0, np.nan, np.nan))
        if len(rows) >= 65536:
            self.fn_chunks.append(np.array(rows, dtype=float))
            rows.clear()
        hw = d.hardware
        gpu = hw.gpu
        self.sig.extend([_num(gpu.get(s)) if s in GPU_SIGNALS else _num(getattr(hw, s)) for s in SIGNALS])
        for k, s in enumerate(PER_STEP_SIGNALS):
            ps = hw.per_step.get(s)
            if ps:
                self.ps_meta.extend((i, k, len(ps), len(self.ps_vals)))
                # the fast path: a list without None is a list of floats (no per-element conversion)
                self.ps_vals.extend(cast(list[float], ps) if None not in ps else [_num(x) for x in ps])
        sc = self.scalars
        sc["baseline"].append(_num(d.step_times.baseline_median_seconds))
        sc["cores"].append(len(hw.per_core_util_ratio))
        sc["own"].append(1.0 if own_link(d) else 0.0)
        link = link_signature(d)
        for name, val in zip(("lmean", "lcv", "lshare"), link[:3] if link else (np.nan,) * 3):
            sc[name].append(val)
        sc["world"].append(d.job.world_size)
        sc["start"].append(d.window.start_step)
        sc["end"].append(d.window.end_step)
        sc["node_steps"].append(n if d.autograd_nodes_steps is None else d.autograd_nodes_steps)
        for name in OVERHEAD_FIELDS:
            sc[name].append(getattr(d.overhead, name))
        t = self.text
        t["host"].append(d.job.hostname)
        t["device"].append(d.job.device)
        t["role"].append(d.job.role)
        t["part"].append(partition(d))
        t["trigger"].append(d.window.trigger)
        t["top"].append(link[3] if link else "")
        t["config"].append(tuple((c.key, c.value) for c in d.config))
        t["since"].append(tuple((c.key, c.since_step) for c in d.config if c.since_step is not None))
        t["gaps"].append(tuple((g.source, g.reason) for g in d.gaps))
        t["privacy"].append(d.privacy)
        t["nodes"].append(tuple(d.autograd_nodes_total.items()))
        self.ops.append(self.op_index.setdefault(op_set(d), len(self.op_index)))

    def seal(self) -> ColumnsBuilder:
        """The function rows as one array (cheap to send between processes); returns self."""
        if self.fn_rows:
            self.fn_chunks.append(np.array(self.fn_rows, dtype=float))
            self.fn_rows = []
        return self

    def merge(self, other: ColumnsBuilder) -> None:
        """Append another builder's documents (loaded elsewhere, e.g. by a worker process) after this
        one's: rows, function and operation-set indices and offsets are renumbered."""
        other.seal()
        nr0, nv0, np0 = len(self.ranks), len(self.fn_vals), len(self.ps_vals)
        cmap = np.array([self.index.setdefault(k, len(self.index)) for k in other.index], dtype=float)
        omap = [self.op_index.setdefault(k, len(self.op_index)) for k in other.op_index]
        for chunk in other.fn_chunks:
            t = chunk.copy()
            t[:, 0] += nr0
            if len(t):
                t[:, 1] = cmap[t[:, 1].astype(np.int64)]
            t[:, 2] += nv0
            self.fn_chunks.append(t)
        self.ranks += other.ranks
        for name in ("fn_vals", "steps", "step_len", "before", "before_len", "sig", "ps_vals"):
            getattr(self, name).extend(getattr(other, name))
        meta = np.frombuffer(other.ps_meta, dtype=np.int64).reshape(-1, 4).copy() if other.ps_meta else None
        if meta is not None:
            meta[:, 0] += nr0
            meta[:, 3] += np0
            self.ps_meta.extend(meta.ravel().tolist())
        for k, v in other.scalars.items():
            self.scalars[k].extend(v)
        for k, lst in other.text.items():
            self.text[k].extend(lst)
        self.ops.extend(omap[o] for o in other.ops)

    def build(self) -> WindowColumns:
        nr, nf = len(self.ranks), len(self.index)
        order = np.argsort(np.array(self.ranks, dtype=np.int64), kind="stable")
        pos = np.empty(nr, dtype=np.int64)        # append index -> sorted row
        pos[order] = np.arange(nr)
        n_r = np.frombuffer(self.step_len, dtype=np.int64) if nr else np.zeros(0, dtype=np.int64)
        width = max(int(n_r.max()) if nr else 0, 1)
        step = _ragged(np.frombuffer(self.steps, dtype=float) if self.steps else np.zeros(0), n_r, width)[order]
        chunks = [*self.fn_chunks, np.array(self.fn_rows, dtype=float).reshape(-1, len(FN_FIELDS))]
        table = np.concatenate(chunks) if chunks else np.zeros((0, len(FN_FIELDS)))
        fi = {k: table[:, c].astype(np.int64) for c, k in enumerate(FN_FIELDS[:5])}
        fv = {k: table[:, c + 5] for c, k in enumerate(FN_FIELDS[5:])}
        rows, cols = pos[fi["row"]], fi["col"]
        vals = np.frombuffer(self.fn_vals, dtype=float) if self.fn_vals else np.zeros(0)
        per_step = np.zeros((nr, nf, width))
        flat = rows * max(nf, 1) + cols
        # a function listed twice by one rank is added up (np.add.at); the usual case, once each, is a
        # plain assignment, many times faster on a wide window
        ordered = np.sort(flat)
        unique = not (ordered[1:] == ordered[:-1]).any()
        for m in np.unique(fi["len"]):
            sel = fi["len"] == m
            block = vals[fi["off"][sel][:, None] + np.arange(m)]
            if unique:
                per_step[rows[sel], cols[sel], : int(m)] = block
            else:
                np.add.at(per_step, (rows[sel], cols[sel], slice(0, int(m))), block)  # type: ignore[arg-type]  # numpy's stubs take no slice in an index tuple

        def mat(values: np.ndarray, fill: float, add: bool) -> np.ndarray:
            out = np.full((nr, nf), fill)
            if add and unique:
                out[rows, cols] = fill + values
            elif add:
                np.add.at(out, (rows, cols), values)
            else:            # the first function of a (rank, key), as a document lists them
                first = (np.arange(len(rows)) if unique
                         else np.unique(rows * max(nf, 1) + cols, return_index=True)[1])
                out[rows[first], cols[first]] = values[first]
            return out

        present = np.zeros((nr, nf), dtype=bool)
        present[rows, cols] = True
        code = np.full((nr, nf), -1, dtype=np.int16)
        np.maximum.at(code, (rows, cols), fi["code"].astype(np.int16))
        sig = (np.frombuffer(self.sig, dtype=float).reshape(nr, len(SIGNALS))[order] if nr
               else np.zeros((0, len(SIGNALS))))
        ps, ps_len = self._per_step_signals(nr, pos)
        sc = {k: (np.frombuffer(v, dtype=float) if v else np.zeros(0))[order] for k, v in self.scalars.items()}
        bl = np.frombuffer(self.before_len, dtype=np.int64) if nr else np.zeros(0, dtype=np.int64)
        bw = max(int(bl.max()) if nr else 0, 1)
        before = _ragged(np.frombuffer(self.before, dtype=float) if self.before else np.zeros(0), bl, bw,
                         right=True)[order]
        txt = {k: [v[j] for j in order] for k, v in self.text.items()}
        ranks = [self.ranks[j] for j in order]
        return WindowColumns(
            ranks=ranks, row={r: i for i, r in enumerate(ranks)}, keys=list(self.index), n_steps=n_r[order],
            step=step, per_step=per_step, present=present, critical=mat(fv["crit"], 0.0, True),
            occurrences=mat(fv["occ"], 0.0, True), metric_code=code, metric_wsum=mat(fv["wsum"], 0.0, True),
            metric_w=mat(fv["w"], 0.0, True), metric_mean=mat(fv["mean"], np.nan, False),
            metric_std=mat(fv["std"], np.nan, False),
            signals={s: sig[:, k].copy() for k, s in enumerate(SIGNALS)}, per_step_signals=ps, per_step_len=ps_len,
            cores=sc["cores"].astype(int), own_link=sc["own"] > 0, link=np.stack([sc["lmean"], sc["lcv"], sc["lshare"]],
                                                                                 axis=1) if nr else np.zeros((0, 3)),
            link_top=txt["top"], hostname=txt["host"], role=txt["role"], partition=txt["part"],
            ops=np.frombuffer(self.ops, dtype=np.int64)[order] if nr else np.zeros(0, dtype=np.int64),
            op_sets=list(self.op_index), world_size=sc["world"].astype(int), start_step=sc["start"].astype(int),
            end_step=sc["end"].astype(int), trigger=txt["trigger"], baseline=sc["baseline"], before=before,
            before_len=bl[order], config=txt["config"], config_since=txt["since"], gaps=txt["gaps"],
            overhead={k: sc[k] for k in OVERHEAD_FIELDS}, privacy=txt["privacy"],
            autograd_nodes=txt["nodes"], autograd_node_steps=sc["node_steps"], device=txt["device"])

    def _per_step_signals(self, nr: int, pos: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        meta = np.frombuffer(self.ps_meta, dtype=np.int64).reshape(-1, 4) if self.ps_meta else np.zeros((0, 4), int)
        vals = np.frombuffer(self.ps_vals, dtype=float) if self.ps_vals else np.zeros(0)
        out, lens = {}, {}
        for k, s in enumerate(PER_STEP_SIGNALS):
            m = meta[meta[:, 1] == k]
            length = np.zeros(nr, dtype=np.int64)
            width = int(m[:, 2].max()) if len(m) else 0
            arr = np.full((nr, max(width, 1)), np.nan)
            for ln in np.unique(m[:, 2]):
                sel = m[m[:, 2] == ln]
                arr[pos[sel[:, 0]], : int(ln)] = vals[sel[:, 3][:, None] + np.arange(ln)]
            length[pos[m[:, 0]]] = m[:, 2]
            out[s], lens[s] = arr, length
        return out, lens


def _ragged(flat: np.ndarray, lengths: np.ndarray, width: int, right: bool = False) -> np.ndarray:
    """Rows of `lengths` values each, concatenated in `flat`, as a [rows, width] array (0-padded on
    the right, or NaN-padded on the left when `right`)."""
    out = np.full((len(lengths), width), np.nan if right else 0.0)
    offs = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, dtype=np.int64)
    for ln in np.unique(lengths):
        if ln == 0:
            continue
        sel = np.flatnonzero(lengths == ln)
        block = flat[offs[sel][:, None] + np.arange(ln)]
        if right:
            out[sel, width - ln:] = block
        else:
            out[sel, :ln] = block
    return out


def window_columns(docs: Iterable[PatternsDoc]) -> WindowColumns:
    b = ColumnsBuilder()
    for d in docs:
        b.add(d)
    return b.build()
