"""Who may do what, checked before a byte of the body is read (one ASGI middleware, no buffering).

- **Host**: the Host header must name this service (loopback, the machine's names and addresses,
  `--allowed-host`), so a page on another site cannot reach it by DNS rebinding.
- **Cross-site writes**: a write whose Origin is another site, or that a browser marks
  `Sec-Fetch-Site: cross-site`, is refused; API writes must be `application/json` (or say no type:
  a browser always sends an Origin with those), never the types a page can post to another origin
  without a CORS preflight (`text/plain`, forms), and page forms `application/x-www-form-urlencoded`.
  With no token configured this is what keeps a web page the operator visits from writing.
- **Tokens**: the service token (every write; every read with `--read-token`); per-job tokens
  (`--job-token-file`) that may only send documents of jobs whose name matches their pattern; and a
  session cookie (HttpOnly, SameSite=Strict) that `/login` sets for people reading the pages and
  using their forms when reads need the token.
- **Size**: a Content-Length over the limit is refused at once; a chunked body is counted as it
  is read (`read_limited`) and refused the moment it passes the limit.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from eroica.collector.sink import GzipTooLarge, gunzip_member
from eroica.service.errors import Malformed, TooLarge, UnsupportedEncoding

log = logging.getLogger("eroica.service")
COOKIE = "eroica_session"
SESSION_SECONDS = 12 * 3600
#: a number a client sends (a session's expiry, a Content-Length): ASCII digits only (int() reads "²" too, and
#: refuses 5000 digits), at most 19 of them
NUMBER = re.compile(r"[0-9]{1,19}")
PUBLIC_READS = ("/healthz", "/metrics", "/login")
FORMS = re.compile(r"/issues/[0-9]+/act|/login|/logout")
#: on every response: no type sniffing, never framed by another page (clickjacking), no full URL to other sites
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"content-security-policy", b"frame-ancestors 'none'"), (b"referrer-policy", b"same-origin")]
JOB_WRITES = re.compile(r"/v1/patterns|/v1/jobs/[^/]+/(?:steps|hang|end|traces)")
JOB_READS = re.compile(r"/v1/jobs/([^/]+)(?:/[^/]+)*")      # a job token reads its own jobs only
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Principal:
    """Who a request is: anyone (no token configured), the service token's holder, a session from
    /login, a job's own token (`jobs`: the job names it may write, a glob), or nobody known (a
    page's form then carries the token in its body)."""

    kind: Literal["open", "admin", "session", "job", "anonymous"]
    jobs: str = ""
    writer: str = ""          # a job token's: "scope:<its glob>", what a job it creates is bound to

    def may_write_job(self, name: str) -> bool:
        return self.kind != "job" or fnmatch.fnmatchcase(name, self.jobs)


def load_job_tokens(path: Any) -> dict[str, str]:
    """A job-token file: one `NAME_GLOB TOKEN` per line, `#` comments; ValueError naming the line."""
    out: dict[str, str] = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the job tokens: {exc.strerror}") from exc
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) < 16:
            raise ValueError(f"{path}:{i}: expected `JOB_NAME_GLOB TOKEN` with a token of at least 16 characters")
        if parts[1] in out:
            raise ValueError(f"{path}:{i}: this token is already given to {out[parts[1]]!r}")
        out[parts[1]] = parts[0]
    return out


@functools.lru_cache(maxsize=1)
def local_names() -> frozenset[str]:
    """The names and addresses this machine answers to (read once per process)."""
    names = {*LOOPBACK, socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
        import psutil

        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0].lower() for a in addrs if a.family in (socket.AF_INET,
                                                                                       socket.AF_INET6))
    except Exception:  # a machine without a resolvable name still serves on its loopback
        pass
    return frozenset(names)


def _host_only(host: str) -> str:
    """`name:port`, `[v6]:port` or `v6` -> the name or address alone, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    try:
        ipaddress.IPv6Address(host)
        return host
    except ValueError:
        return host.rsplit(":", 1)[0] if ":" in host else host


@dataclass
class Access:
    token: str | None
    read_token: bool = False
    job_tokens: dict[str, str] = field(default_factory=dict)      # token -> job name glob
    allowed_hosts: Iterable[str] = ()                            # beyond this machine's own names; "*": any

    def __post_init__(self) -> None:
        extra = {h.lower() for h in self.allowed_hosts}
        self.any_host = "*" in extra
        self.hosts = local_names() | extra

    def host_ok(self, host: str) -> bool:
        return self.any_host or _host_only(host) in self.hosts

    def principal(self, headers: Headers) -> Principal | None:
        if self.token is None:
            return Principal("open")
        got = headers.get("authorization", "")
        if got.startswith("Bearer "):
            bearer = got.removeprefix("Bearer ").strip().encode()
            if hmac.compare_digest(bearer, self.token.encode()):
                return Principal("admin")
            for tok, glob in self.job_tokens.items():
                if hmac.compare_digest(bearer, tok.encode()):
                    return Principal("job", glob, "scope:" + glob)
            return None
        if self.session_ok(_cookie(headers, COOKIE)):
            return Principal("session")
        return None

    # ---------------------------------------------------------------- the session cookie
    def _sign(self, expires: int) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), f"eroica-session:{expires}".encode(), hashlib.sha256).hexdigest()

    def session_value(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        return f"{expires}.{self._sign(expires)}"

    def session_ok(self, value: str | None) -> bool:
        if not value or self.token is None or "." not in value:
            return False
        expires, _, sig = value.partition(".")
        # a signature compared as bytes (compare_digest refuses text that is not ASCII)
        if NUMBER.fullmatch(expires) is None or int(expires) <= time.time():
            return False
        return hmac.compare_digest(sig.encode(), self._sign(int(expires)).encode())


def _cookie(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


class Guard:
    """The checks above, as pure ASGI middleware: a refusal is answered before the app (and before
    the body is read); what passes carries its principal in `request.state.principal`."""

    def __init__(self, app: ASGIApp, access: Access, max_body_bytes: int) -> None:
        self.app, self.access, self.limit = app, access, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async def secured(message: Any) -> None:    # every response carries the security headers
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        refusal, principal = self.check(scope)
        if refusal is not None:
            status, message, fld = refusal
            log.warning("eroica serve: %s %s refused (%d): %s", scope["method"], scope["path"], status, message)
            await _respond(secured, status, message, fld, scope)
            return
        scope.setdefault("state", {})["principal"] = principal or Principal("anonymous")
        await self.app(scope, receive, secured)

    def check(self, scope: Scope) -> tuple[tuple[int, str, str] | None, Principal | None]:
        h = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        host = h.get("host", "")
        if not self.access.host_ok(host):
            return (421, f"this service does not answer to the host {host[:100]!r} (start it with --allowed-host "
                         f"{_host_only(host)[:100] or 'NAME'} to allow it)", "host"), None
        write = method not in ("GET", "HEAD", "OPTIONS")
        form = FORMS.fullmatch(path) is not None
        if write:
            origin, site = h.get("origin"), h.get("sec-fetch-site")
            if site == "cross-site" or (origin is not None and not self._same_origin(origin, host)):
                return (403, f"a write from another site (Origin {str(origin)[:100]!r}, Sec-Fetch-Site "
                             f"{site!r}) is refused", "origin"), None
            ctype = h.get("content-type", "").split(";")[0].strip().lower()
            # application/x-ndjson (a batch of documents) is no more a "simple" request than JSON: a
            # page on another site cannot send it without a CORS preflight, which this service never grants
            want = ("application/x-www-form-urlencoded",) if form else ("application/json", NDJSON, "")
            if ctype not in want:
                return (415, f"Content-Type must be {want[0]}, got {ctype!r}", "content-type"), None
        size = h.get("content-length")
        digits = size is not None and NUMBER.fullmatch(size) is not None
        if size is not None and (not digits or int(size) > self.limit):
            return (413 if digits else 400, f"body of {size[:20]} bytes: over {self.limit} or not a "
                                                    "number", "body"), None
        principal = self.access.principal(h)
        needs = (write and not form) or (self.access.read_token and path not in PUBLIC_READS and not form)
        if needs and principal is None:
            return (401, "missing or wrong bearer token", "authorization"), None
        if write and principal is not None and principal.kind == "job" and not JOB_WRITES.fullmatch(path):
            return (403, "a job's token may only send its job's documents", "authorization"), None
        if not write and principal is not None and principal.kind == "job" and path not in PUBLIC_READS:
            m = JOB_READS.fullmatch(path)
            if m is None or not principal.may_write_job(urllib.parse.unquote(m.group(1))):
                return (403, f"a job's token reads only its own jobs (/v1/jobs/<id> within {principal.jobs!r}); the "
                             "fleet's jobs, issues and pages need the service's token", "authorization"), None
        if write and principal is not None and principal.kind == "session" and not form:
            return (401, "the API's writes need the bearer token (a session is for the pages)", "authorization"), None
        return None, principal

    def _same_origin(self, origin: str, host: str) -> bool:
        try:
            u = urllib.parse.urlsplit(origin)
        except ValueError:
            return False
        return u.scheme in ("http", "https") and u.netloc.lower() == host.lower() and self.access.host_ok(u.netloc)


async def _respond(send: Send, status: int, message: str, fld: str, scope: Scope) -> None:
    html = scope["method"] == "GET" and status == 401 and not scope["path"].startswith("/v1/")
    if html:      # a person at the pages: to the login form, then back
        nxt = urllib.parse.quote(scope["path"])
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", f"/login?next={nxt}".encode()), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    body = json.dumps({"error": message, "field": fld}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def principal_of(request: Request) -> Principal:
    return getattr(request.state, "principal", None) or Principal("anonymous")


NDJSON = "application/x-ndjson"


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body as sent (gzip'd or not), refused (413) the moment it passes `limit` bytes:
    a chunked body has no Content-Length to check beforehand."""
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise TooLarge(f"body over {limit} bytes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """The body, gunzipped when it says so, never more than `limit` bytes once decompressed."""
    return unpack_body(raw, encoding, limit)[0]


def unpack_body(raw: bytes, encoding: str | None, limit: int) -> tuple[bytes, bytes | None]:
    """(the body, `raw` when it is exactly one gzip member of the body, else None): a body that came
    compressed can be kept as it came, never with a second member nobody read."""
    enc = (encoding or "").lower().strip()
    if enc in ("", "identity"):
        return raw, None
    if enc != "gzip":
        raise UnsupportedEncoding(f"Content-Encoding {enc[:40]!r} is not supported (gzip or none)", "content-encoding")
    try:
        out, whole = gunzip_member(raw, limit)
    except GzipTooLarge as exc:
        raise TooLarge(f"body over {limit} bytes once decompressed", "body") from exc
    except ValueError as exc:
        raise Malformed(f"Content-Encoding gzip, but the body is {exc}", "body") from exc
    return out, (raw if whole else None)
