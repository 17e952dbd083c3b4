"""Link signatures: which rank's network link holds back a communication-bound group.

In a ring all-reduce every rank's step and collective time grow alike when one link is capped,
so durations cannot name the culprit. The link's byte-rate signature during communication can:
the capped link runs steady and low (small sigma relative to its mean), the other links of the
ring are bursty (they idle, then catch up after every chunk). Steadiness is relative (one link of
N is always the steadiest), so each fact also carries absolute evidence: the link's own peak rate
(mean + 2 sigma) against the peak its peers reach in the same collectives. A capped link never
gets near its peers' bursts; a healthy link of a rank that is late for another reason (it never
waits, so it sends steadily) runs at the peers' peak. Needs the collector's ~1 kHz NIC
sampling and ranks with their own interfaces (not one shared loopback).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eroica.engine.facts import Fact, LinkSignature
from eroica.engine.signals import LARGE_GROUP
from eroica.schema.patterns import Category, MetricName, PatternsDoc

if TYPE_CHECKING:
    from eroica.engine.columns import WindowColumns

MIN_COMM_SHARE = 0.2         # the group must spend at least this share of a step in communication
MAX_CV_RATIO = 0.7           # a rank is reported when its rate spread / mean is this far below its peers'


def link_signature(doc: PatternsDoc) -> tuple[float, float, float, str] | None:
    """(mean bytes/s, coefficient of variation, communication share of the window, top function)."""
    num = cv_num = w = crit = 0.0
    top, top_crit = "", -1.0
    for f in doc.functions:
        if f.category != Category.communication:
            continue
        crit += f.critical_seconds
        if f.critical_seconds > top_crit:
            top, top_crit = f.name, f.critical_seconds
        if f.metric != MetricName.nic_bytes_per_second or not f.metric_mean or f.metric_std is None:
            continue
        num += f.metric_mean * f.critical_seconds
        cv_num += (f.metric_std / f.metric_mean) * f.critical_seconds
        w += f.critical_seconds
    if w <= 0 or doc.window.wall_seconds <= 0:
        return None
    return num / w, cv_num / w, crit / doc.window.wall_seconds, top


def own_link(doc: PatternsDoc) -> bool:
    """True when the rank's traffic goes over an interface of its own (not a loopback that every
    local rank shares, where byte counters say nothing about one rank's link)."""
    return any(rate > 0 for name, rate in doc.hardware.nic_bytes_per_second.items() if name != "lo")


def link_facts(cols: WindowColumns, ranks: list[int], comm_wait: dict[int, float]) -> list[Fact]:
    """A late rank of any other cause also communicates steadily (it arrives last and never
    waits), so each fact carries the rank's communication wait beside its peers': a capped link
    waits as long as everyone, a late rank much less."""
    rows = np.array([cols.row[r] for r in ranks], dtype=int)
    if not cols.own_link[rows].all():
        return []
    have = ~np.isnan(cols.link[rows, 0])
    if have.sum() < 3:
        return []
    order = [r for r, h in zip(ranks, have) if h]
    sig_rows = rows[have]
    means, cvs, shares = (cols.link[sig_rows, k] for k in range(3))
    share = float(np.median(shares))
    if share < MIN_COMM_SHARE:
        return []
    waits = np.array([comm_wait.get(p, 0.0) for p in ranks])
    large = len(order) >= LARGE_GROUP        # one rank cannot move the others' median: the whole one
    whole_cv, whole_wait = float(np.median(cvs)), float(np.median(waits))
    med_mean = float(np.median(means))
    peaks = means * (1.0 + 2.0 * cvs)          # the rate a link reaches in its bursts
    steadiest = _steadiest(cvs, means, [cols.hostname[int(i)] for i in sig_rows])
    out: list[Fact] = []
    for k in np.flatnonzero(cvs <= MAX_CV_RATIO * (whole_cv if large else np.inf)):
        r, mean, cv = order[k], float(means[k]), float(cvs[k])
        med_cv = whole_cv if large else float(np.median(np.delete(cvs, k)))
        ratio = cv / med_cv if med_cv > 0 else 1.0
        if ratio > MAX_CV_RATIO:
            continue
        wait_med = whole_wait if large else float(np.median(waits[np.array(ranks) != r]))
        wait = comm_wait.get(r, 0.0)
        peer_peak = float(np.median(peaks)) if large else float(np.median(np.delete(peaks, k)))
        out.append(
            LinkSignature(
                rank=r, function=cols.link_top[int(sig_rows[k])], mean_bytes_per_second=round(mean, 1),
                cv_ratio=round(cv, 4), peer_median_cv_ratio=round(med_cv, 4), cv_ratio_to_median=round(ratio, 4),
                rate_ratio_to_median=round(mean / med_mean, 4) if med_mean > 0 else 1.0,
                comm_share_ratio=round(share, 4), excess_step_ratio=round(share, 4),
                steadiest=bool(steadiest[k]),
                comm_wait_ratio_to_median=round(wait / wait_med if wait_med > 0 else 1.0, 4),
                peak_bytes_per_second=round(float(peaks[k]), 1), peer_median_peak_bytes_per_second=round(peer_peak, 1),
                peak_ratio_to_peers=round(float(peaks[k]) / peer_peak, 4) if peer_peak > 0 else 1.0,
            )
        )
    return out


SAME_LINK_RATE_RATIO = 0.1    # ranks of one host within this of each other's byte rate read one interface


def _steadiest(cvs: np.ndarray, means: np.ndarray, hosts: list[str]) -> np.ndarray:
    """The steadiest link of the group, and the ranks that share it: ranks of the same host whose
    byte rate is the steadiest one's (they read the same interface's counters, so one capped link
    is all of its host's ranks' link, not one rank's)."""
    k = int(np.argmin(cvs))
    out: np.ndarray = np.asarray(cvs <= cvs[k] + 1e-12)
    for j in range(len(cvs)):
        if (hosts[j] == hosts[k] and means[k] > 0 and abs(means[j] - means[k]) <= SAME_LINK_RATE_RATIO * means[k]
                and cvs[j] <= 1.5 * cvs[k] + 1e-12):
            out[j] = True
    return out

