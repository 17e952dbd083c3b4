"""An app of the service on a fresh SQLite database, with its loops running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import TOKEN

from eroica.service.app import Settings, create_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'e.db'}", token=TOKEN, grace_seconds=1.0,
                              poll_seconds=0.1, max_body_bytes=200_000))
    with TestClient(app) as c:
        yield c
