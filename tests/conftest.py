"""Shared fixtures."""

from __future__ import annotations

import pytest
from patterns_factory import make_doc

from eroica.collector.facts import PatternsDoc


@pytest.fixture
def healthy_docs() -> list[PatternsDoc]:
    return [make_doc(r) for r in range(4)]
