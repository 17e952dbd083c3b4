"""The GPU path on a real GPU (deselected by default: `pytest -m gpu` on a machine with CUDA):
NVML fields arrive, CUDA kernels and memcpy land in the patterns, pageable and pinned copies are
named apart. bench/gpu_check.py runs the same loops and also a co-located GPU workload."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _check():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[3] / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", ["healthy", "pinned"])
def test_nvml_kernels_and_copies_reach_the_patterns(tmp_path: Path, case: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    r = _check().loop(tmp_path, case, "cuda", 40)
    assert r["ok"], r
