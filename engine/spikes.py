"""One-off step spikes: a step of the window that took many times the usual step time.

A host hiccup (a multi-second stall in uninterruptible I/O, a paused VM, a page-cache flush) can
hold one step up for longer than all the window's other steps together. Averaged over the window
it would swamp the sustained fault that made the detector fire, and make the rank it hit look
like the culprit of the whole window. So a *rare* spike (at most one step in ten, eight times the
median step, and longer than the window's other steps together) is taken out of
the peer comparison and reported on its own, as a `step_spike` fact naming the rank that was busy
while the others waited, and what held its critical path. Spikes that recur are a pattern (an
intermittent fault) and stay in the comparison.

A spike in a step where the job runs *scheduled* work is not a one-off either: a checkpoint written
every N steps, or an evaluation pass, lands once in a window of fewer than N steps, but every rank
runs it in that same step and in no other. Such a step stays in the comparison (its function, I/O
wait and CPU are the evidence), and a rank whose excess sits in the scheduled steps is judged by
those steps alone: slow in every checkpoint it wrote is consistent, not a 1-in-10 fluke.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eroica.engine.facts import StepSpike

SPIKE_RATIO = 8.0          # a step this many times the window's median step time ...
MAX_SPIKE_SHARE = 0.1      # ... in at most this share of the window's steps (at least one) ...
DOMINATES_RATIO = 1.0      # ... whose extra time is at least all the other steps' time together
MIN_STEPS = 5              # fewer steps than this: no reliable median to compare with
SPIKE_SIGNALS = ("io_wait_ratio", "runqueue_wait_ratio", "cpu_util_ratio")   # what the rank's thread did then


MAX_SCHEDULED_SHARE = 0.34   # scheduled work runs in at most a third of the window's steps


def scheduled_steps(per_step: np.ndarray, keys: Sequence[tuple[str, str]]) -> list[np.ndarray]:
    """The step masks of the job's scheduled work in the window, one per distinct schedule: a
    function (not communication) that every rank runs in the same few steps and in no other
    (`per_step` is [rank, key, step] critical seconds)."""
    n_steps = per_step.shape[2] if per_step.ndim == 3 else 0
    out: list[np.ndarray] = []
    if n_steps < MIN_STEPS or per_step.shape[0] < 2:
        return out
    ran = per_step > 0
    for j, k in enumerate(keys):
        if k[0] == "communication":
            continue
        steps = ran[:, j, :]
        first = steps[0]
        if not first.any() or first.sum() > MAX_SCHEDULED_SHARE * n_steps:
            continue
        if (steps == first[None, :]).all() and not any((m == first).all() for m in out):
            out.append(first.copy())     # every rank, the same steps
    return out


def kept_steps(step: np.ndarray, scheduled: list[np.ndarray] | None = None) -> np.ndarray:
    """Mask over the window's steps of those the peer comparison keeps; `step` is [rank, step];
    `scheduled` marks the steps of scheduled work, whose spikes are kept (they are evidence)."""
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
        for m in scheduled or []:
            if len(m) == n:
                keep |= m
    return keep


def spike_facts(
    ranks: list[int], start_step: int, step: np.ndarray, busy_steps: np.ndarray,
    keys: list[tuple[str, str]], per_step: np.ndarray, present: np.ndarray, keep: np.ndarray,
    per_step_hw: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[StepSpike]:
    """A fact for each left-out step: the rank busiest in it, beside the others in that step.
    `per_step` is [rank, key, step] critical seconds, `present` [rank, key] the keys each rank has;
    `per_step_hw` the collector's per-step signals: signal -> ([rank, step] values, [rank] lengths)."""
    out: list[StepSpike] = []
    if not (~keep).any():
        return out
    job = np.median(step, axis=0)
    med = float(np.median(job[keep]))
    total = float(job.sum())
    for s in np.flatnonzero(~keep):
        i = int(np.argmax(busy_steps[:, s]))
        others = np.delete(busy_steps[:, s], i)
        cands = [(float(per_step[i, j, s]), k) for j, k in enumerate(keys)
                 if present[i, j] and k[0] != "communication" and s < per_step.shape[2]]
        sec, (cat, fn) = max(cands, default=(0.0, (None, None)))
        at: dict[str, float | None] = {}
        for sig, (vals, lens) in (per_step_hw or {}).items():
            if s < lens[i]:
                at[sig] = None if np.isnan(vals[i, s]) else float(vals[i, s])
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
