"""The engine's median and percentile give numpy's values to the bit (its decisions are unchanged),
without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from eroica.engine.order_stats import median, percentile


def _same(a: object, b: object) -> bool:
    a_, b_ = np.asarray(a), np.asarray(b)
    return a_.shape == b_.shape and a_.dtype == b_.dtype and np.array_equal(a_, b_, equal_nan=True)


def _arrays(rng: np.random.Generator) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for n in (1, 2, 3, 4, 5, 8, 17, 64):
        out.append(rng.normal(size=n))
        out.append(rng.lognormal(size=(n, 3)))
        out.append(rng.integers(0, 9, size=(n, 2)))
        ties = rng.choice([0.1, 0.2, 0.30000000000000004], size=(n, 4))
        out.append(ties)
        with_nan = rng.normal(size=(n, 3))
        with_nan[rng.integers(0, n), rng.integers(0, 3)] = np.nan
        out.append(with_nan)
        out.append(np.ascontiguousarray(rng.normal(size=(3, n)).T) * 1e-7)
    return out


def test_median_is_numpys_to_the_bit_on_every_axis_with_ties_integers_and_nan() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        for a in _arrays(rng):
            for axis in (None, 0, *(range(1, a.ndim))):
                with np.errstate(all="ignore"):
                    assert _same(median(a, axis=axis), np.median(a, axis=axis)), (a, axis)
            assert _same(median(list(a.ravel())), np.median(list(a.ravel())))


@pytest.mark.parametrize("q", [0, 10, 25, 50, 73.3, 90, 99, 100])
def test_percentile_is_numpys_linear_method_to_the_bit(q: float) -> None:
    rng = np.random.default_rng(11)
    for _ in range(20):
        for a in _arrays(rng):
            for axis in (None, 0):
                assert _same(percentile(a, q, axis=axis), np.percentile(a, q, axis=axis)), (a, q, axis)


def test_empty_input_gets_numpys_own_answer() -> None:
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        assert np.isnan(median(np.array([])))


def test_neither_imports_numpy_ma() -> None:
    code = ("import sys, numpy as np\n"
            "from eroica.engine.order_stats import median, percentile\n"
            "x = np.array([[1.0, np.nan], [3.0, 4.0], [2.0, 2.0]])\n"
            "median(x); median(x, axis=0); percentile(x, 90, axis=0); percentile([1, 2], 50)\n"
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
