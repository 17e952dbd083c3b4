"""What the service refuses, as kinds of refusal: the domain code says which kind, why and which field
is wrong; the HTTP status of each kind is the API's business, mapped in one place (`STATUS`, used by
the one exception handler in eroica.service.app, the pages and the watcher's log).

    ServiceError       a request the service refuses (base)
      Malformed        not what was asked for at all: not JSON, not gzip, an empty batch (400)
      Unauthorized     no token, or the wrong one (401)
      Forbidden        a token that may not do this (403)
      NotFound         no such job, window, issue or trace (404)
      Conflict         it contradicts what is stored: another document for a stored rank, a name
                       that cannot change, an issue state that cannot follow (409)
      TooLarge         over a size limit (413)
      UnsupportedEncoding  a body encoding the service does not read (415)
      Invalid          well-formed but wrong: a field's value, a rank outside the job's world (422)
"""

from __future__ import annotations


class ServiceError(ValueError):
    """A request the service refuses: `message` says why, `field` what is wrong."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.message, self.field = message, field

    @property
    def status(self) -> int:
        return STATUS[type(self)]


class Malformed(ServiceError):
    pass


class Unauthorized(ServiceError):
    pass


class Forbidden(ServiceError):
    pass


class NotFound(ServiceError):
    pass


class Conflict(ServiceError):
    pass


class TooLarge(ServiceError):
    pass


class UnsupportedEncoding(ServiceError):
    pass


class Invalid(ServiceError):
    pass


#: each kind's HTTP status (every kind has one: a new kind without one fails at import)
STATUS: dict[type[ServiceError], int] = {
    Malformed: 400, Unauthorized: 401, Forbidden: 403, NotFound: 404, Conflict: 409, TooLarge: 413,
    UnsupportedEncoding: 415, Invalid: 422,
}
assert set(STATUS) == set(ServiceError.__subclasses__()), "a ServiceError kind without its HTTP status"
