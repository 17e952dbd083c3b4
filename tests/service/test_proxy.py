"""Behind a reverse proxy that terminates TLS (docs/deploy.md): the session cookie is Secure when a trusted
proxy says the request came over https (X-Forwarded-Proto), and an untrusted client's forwarded headers are
ignored. A real `eroica serve`, as a user runs it."""

from __future__ import annotations

import http.client
import subprocess
import sys
from pathlib import Path

from service_support import SERVE_TOKEN, serve


def login_cookie(base: str, headers: dict[str, str]) -> str:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request("POST", "/login", body=f"token={SERVE_TOKEN}&next=/",
              headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 303, r.status
    cookie = r.getheader("Set-Cookie") or ""
    assert cookie.startswith("eroica_session=") and "HttpOnly" in cookie, cookie
    return cookie


def test_the_session_cookie_is_secure_behind_a_trusted_tls_proxy_and_not_otherwise(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with serve(tmp_path / "a", "--read-token") as base:         # the default: a proxy on this machine
        assert "Secure" in login_cookie(base, {"X-Forwarded-Proto": "https"})
        assert "Secure" not in login_cookie(base, {})
    (tmp_path / "b").mkdir()
    with serve(tmp_path / "b", "--read-token", "--trusted-proxy", "10.20.30.0/24") as base:
        # this client is not the trusted proxy: what it says of the scheme is not believed
        assert "Secure" not in login_cookie(base, {"X-Forwarded-Proto": "https"})


def test_a_trusted_proxy_that_is_not_an_address_is_refused(tmp_path: Path) -> None:
    eroica = Path(sys.executable).parent / "eroica"
    p = subprocess.run([str(eroica), "serve", "--data", str(tmp_path), "--trusted-proxy", "proxy.example"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--trusted-proxy 'proxy.example' is not an address or a network" in p.stderr
