"""The overlap-weighted metric per function (collector/critical.py), computed for every segment at
once, against its plain definition (one segment at a time) on random windows: NaN samples,
repeated timestamps, segments before, after and across the samples."""

from __future__ import annotations

import numpy as np

from eroica.collector.critical import Segments, metric_by_key
from eroica.schema.patterns import Category


def _definition(seg: Segments, t: np.ndarray, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = len(seg.names)
    w_sum, x_sum, x2_sum, cnt = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k, dtype=np.int64)
    for s, e, key in zip(seg.start_ns, seg.end_ns, seg.key):
        for i in range(len(t) - 1):
            w = float(min(t[i + 1], e) - max(t[i], s))
            if w > 0 and np.isfinite(rate[i]):
                w_sum[key] += w
                x_sum[key] += w * rate[i]
                x2_sum[key] += w * rate[i] ** 2
                cnt[key] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = x_sum / w_sum
        return mean, np.sqrt(np.maximum(x2_sum / w_sum - mean * mean, 0.0)), cnt


def test_every_segment_at_once_is_the_definition() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        n_s, k = int(rng.integers(0, 30)), int(rng.integers(1, 5))
        t = np.sort(rng.integers(0, 10_000, n_s)).astype(np.int64)
        if trial % 3 == 0 and n_s > 3:
            t[2] = t[1]                                   # two samples at the same time
        rate = rng.normal(5, 2, max(n_s - 1, 0))
        if n_s > 4:
            rate[rng.integers(0, n_s - 1, 2)] = np.nan    # a source that failed to read
        n = int(rng.integers(0, 25))
        st = rng.integers(-500, 10_500, n).astype(np.int64)
        seg = Segments(start_ns=st, end_ns=st + rng.integers(0, 3000, n), key=rng.integers(0, k, n),
                       names=[(Category.compute, str(i)) for i in range(k)])
        got, want = metric_by_key(seg, t, rate), _definition(seg, t, rate)
        if n_s < 2:
            assert np.isnan(got[0]).all() and not got[2].any()
            continue
        for g, w in zip(got, want):
            assert np.allclose(np.nan_to_num(g, nan=-1.0), np.nan_to_num(w, nan=-1.0), rtol=1e-9, atol=1e-6), trial
