"""A session cookie is whatever a client sends (found by tests/service/test_fuzz.py): an expiry of digits
int() reads but are not ASCII ("²"), of more digits than int() converts, or a signature that is not
ASCII was a 500 from the guard, before any route; it is no session, and the request goes on as anyone's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_support import LOCAL, TOKEN
from starlette.datastructures import Headers

from eroica.service.app import Settings, create_app
from eroica.service.guard import COOKIE, Access

FUTURE = str(int(time.time()) + 3600)


@pytest.mark.parametrize("value", ["\u00b2.abc", "1\u00b2" + FUTURE + ".abc", "9" * 5000 + ".abc",
                                   FUTURE + ".\u00e9", FUTURE + ".\u00ff" * 64, ".abc", FUTURE + "."])
def test_a_hostile_session_cookie_is_no_session_never_an_error(value: str) -> None:
    access = Access(TOKEN)
    assert access.session_ok(value) is False
    raw = f"{COOKIE}={value}".encode("latin-1")          # as the header comes off the wire
    assert access.principal(Headers(raw=[(b"cookie", raw)])) is None


def test_a_real_session_still_is_one() -> None:
    access = Access(TOKEN)
    assert access.session_ok(access.session_value())
    assert not access.session_ok(access.session_value(now=time.time() - 2 * 86400))    # expired


def test_over_http_a_cookie_of_5000_digits_is_a_refusal_naming_its_field(tmp_path: Path) -> None:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 's.db'}", token=TOKEN, read_token=True), start=False)
    with TestClient(app, base_url=LOCAL) as c:
        r = c.get("/v1/jobs", headers={"Cookie": f"{COOKIE}={'9' * 5000}.abc"})
        assert r.status_code == 401 and r.json()["field"] == "authorization", r.text
