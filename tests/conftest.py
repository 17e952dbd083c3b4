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
