"""Shared fixtures."""

from __future__ import annotations

import pytest
from patterns_factory import make_doc

from eroica.schema.patterns import PatternsDoc


@pytest.fixture
def healthy_docs() -> list[PatternsDoc]:
    return [make_doc(r) for r in range(4)]


try:   # property tests: reproducible, no example database written into the checkout
    from hypothesis import HealthCheck, settings

    settings.register_profile("eroica", deadline=None, database=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("eroica")
except ImportError:   # pragma: no cover - hypothesis is a dev dependency
    pass


def _cuda_device() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return bool(pynvml.nvmlDeviceGetCount())
    except Exception:   # noqa: BLE001 - no library, no driver, no device: the same answer
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests are deselected by default (pyproject's -m); selected anyway (`-m "not e2e"`), they
    skip with the reason on a machine without an NVIDIA GPU, instead of failing there."""
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    if gpu and not _cuda_device():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU with its driver and nvidia-ml-py "
                                                    "(pip install 'eroica[gpu]'); bench/gpu_session.sh runs these"))
