"""One-off step spikes: a step of the window that took many times the usual step time.

A host hiccup (a multi-second stall in uninterruptible I/O, a paused VM, a page-cache flush) can
hold one step up for longer than all the window's other steps together. Averaged over the window
it would swamp the sustained fault that made the detector fire, and make the rank it hit look
like the culprit of the whole window. So a *rare* spike (at most one step in ten, eight times the
median step, and longer than the window's other steps together) is taken out of
the peer comparison and reported on its own, as a `step_spike` fact naming the rank that was busy
while the others waited, and what held its critical path. Spikes that recur are a pattern (an
intermittent fault) and stay in the comparison.
"""

from __future__ import annotations

import numpy as np

from eroica.engine.facts import StepSpike

SPIKE_RATIO = 8.0          # a step this many times the window's median step time ...
MAX_SPIKE_SHARE = 0.1      # ... in at most this share of the window's steps (at least one) ...
DOMINATES_RATIO = 1.0      # ... whose extra time is at least all the other steps' time together
MIN_STEPS = 5              # fewer steps than this: no reliable median to compare with


def kept_steps(step: np.ndarray) -> np.ndarray:
    """Mask over the window's steps of those the peer comparison keeps; `step` is [rank, step]."""
    n = step.shape[1] if step.ndim == 2 else 0
    keep = np.ones(n, dtype=bool)
    if n < MIN_STEPS or step.shape[0] == 0:
        return keep
    job = np.median(step, axis=0)
    med = float(np.median(job))
    if med <= 0:
        return keep
    spikes = job > SPIKE_RATIO * med
    extra = float((job[spikes] - med).sum())
    if 0 < int(spikes.sum()) <= max(1, int(n * MAX_SPIKE_SHARE)) and extra >= DOMINATES_RATIO * job[~spikes].sum():
        keep = ~spikes
    return keep


def spike_facts(
    ranks: list[int], start_step: int, step: np.ndarray, busy_steps: np.ndarray,
    per_key: list[dict[tuple[str, str], np.ndarray]], keep: np.ndarray,
    per_step_hw: list[dict[str, list[float | None]]] | None = None,
) -> list[StepSpike]:
    """A fact for each left-out step: the rank busiest in it, beside the others in that step."""
    out: list[StepSpike] = []
    if not (~keep).any():
        return out
    job = np.median(step, axis=0)
    med = float(np.median(job[keep]))
    total = float(job.sum())
    for s in np.flatnonzero(~keep):
        i = int(np.argmax(busy_steps[:, s]))
        others = np.delete(busy_steps[:, s], i)
        cands = [(float(v[s]), k) for k, v in per_key[i].items() if k[0] != "communication" and s < len(v)]
        sec, (cat, fn) = max(cands, default=(0.0, (None, None)))
        hw = (per_step_hw or [{}] * len(ranks))[i]
        at = {sig: v[s] for sig, v in hw.items() if s < len(v)}
        out.append(
            StepSpike(
                rank=ranks[i], step_number=start_step + int(s), step_seconds=round(float(job[s]), 6),
                median_step_seconds=round(med, 6), ratio_to_median=round(float(job[s]) / med, 3) if med > 0 else 0.0,
                busy_seconds=round(float(busy_steps[i, s]), 6),
                peer_median_busy_seconds=round(float(np.median(others)), 6) if len(others) else 0.0,
                busy_share_ratio=round(float(min(busy_steps[i, s] / job[s], 1.0)), 4) if job[s] > 0 else 0.0,
                category=cat, function=fn, function_seconds=round(sec, 6),
                excess_step_ratio=round(float((job[s] - med) / total), 4) if total > 0 else 0.0,
                consistency_ratio=round(1 / len(keep), 4),
                io_wait_ratio=at.get("io_wait_ratio"), runqueue_wait_ratio=at.get("runqueue_wait_ratio"),
                cpu_util_ratio=at.get("cpu_util_ratio"),
            )
        )
    return out
