"""An app of the service on a fresh SQLite database, with its loops running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import LOCAL, TOKEN

from eroica.service.app import Settings, create_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'e.db'}", token=TOKEN, grace_seconds=1.0,
                              poll_seconds=0.1, max_body_bytes=200_000))
    with TestClient(app, base_url=LOCAL) as c:
        yield c


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    """The service on a real port (uvicorn in a thread), for clients that speak HTTP."""
    import threading
    import time

    import uvicorn
    from service_support import free_port

    port = free_port()
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'live.db'}", token=TOKEN, grace_seconds=1.0,
                              poll_seconds=0.1))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    t.join(10)
