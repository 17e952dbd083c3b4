"""Median and percentile, the same values as numpy's to the bit (NaN included: tested), without the
first call's import of numpy.ma (numpy's NaN check reads `np.ma`): ~10 ms of every short
`eroica diagnose`, which is mostly imports."""

from __future__ import annotations

from typing import Any

import numpy as np


def _nan_last(s: np.ndarray, out: Any, axis: int) -> Any:
    """numpy's rule: a slice holding a NaN has a NaN median or percentile (sorted, NaN is last)."""
    if not np.issubdtype(s.dtype, np.inexact):
        return out
    last = s.take(-1, axis=axis)
    nan = np.isnan(last)
    if not nan.any():
        return out
    if np.ndim(out) == 0:
        return last[()] if isinstance(last, np.ndarray) else last
    out = np.array(out)
    np.copyto(out, last, where=nan)
    return out


def _sorted(x: Any, axis: int | None) -> tuple[np.ndarray, int]:
    a = np.asarray(x)
    if axis is None:
        return np.sort(a, axis=None), 0
    return np.sort(a, axis=axis), axis


def median(x: Any, axis: int | None = None) -> Any:
    """np.median(x, axis): the mean of the middle one or two sorted values, as numpy takes it."""
    if np.size(x) == 0:
        return np.median(x, axis=axis)             # numpy's own empty answer (NaN, and its warning)
    s, ax = _sorted(x, axis)
    n = s.shape[ax]
    k = n // 2
    middle = s.take(np.arange(k, k + 1) if n % 2 else np.arange(k - 1, k + 1), axis=ax)
    return _nan_last(s, np.mean(middle, axis=ax), ax)


def percentile(x: Any, q: float, axis: int | None = None) -> Any:
    """np.percentile(x, q, axis) for one q, numpy's default (linear) method and its interpolation."""
    if np.size(x) == 0:
        return np.percentile(x, q, axis=axis)
    s, ax = _sorted(x, axis)
    n = s.shape[ax]
    virtual = (n - 1) * (q / 100)
    lo = int(virtual)
    hi = min(lo + 1, n - 1)
    a, b = s.take(lo, axis=ax).astype(float), s.take(hi, axis=ax).astype(float)
    t = virtual - lo
    diff = b - a
    out = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    return _nan_last(s, out, ax)
