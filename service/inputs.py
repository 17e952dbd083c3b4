"""What the API accepts, typed and bounded: an issue's transition here, and the wire documents of
eroica.schema (a step summary, a rank's hang snapshot). Every number fits the columns it is stored
in (a step or rank in 32 bits), every string has a length, and a hang snapshot's parts are typed
down to the fields the engine reads, so a well-formed but hostile document is a 422 naming its
field, never a 500 (which the sink would retry and spool forever)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eroica.engine import RunDirError
from eroica.schema.hang import MAX_INT, HangSnapshot  # noqa: F401  (routes read MAX_INT here)
from eroica.service.errors import Invalid, Malformed, ServiceError


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TransitionIn(In):
    who: str = Field(min_length=1, max_length=200)
    why: str | None = Field(None, max_length=4000)
    url: str | None = Field(None, max_length=2000)
    kind: str | None = Field(None, max_length=32)


#: where a request's part sits, not part of the field's name
_REQUEST_PARTS = ("path", "query", "header", "body")


def first_problem(errors: Sequence[Mapping[str, Any]], prefix: str = "", default_field: str = "body") -> ServiceError:
    """Pydantic's (or FastAPI's) validation errors as the service's refusal: the first problem,
    naming its field; a body that is not JSON is malformed, a wrong value invalid. The one translation
    of validation errors: documents, batches' lines, hang snapshots, traces and request parameters."""
    if not errors:
        return Invalid(prefix + "invalid request", default_field)
    err = errors[0]
    if err.get("type") == "json_invalid":
        return Malformed(f"{prefix}not JSON: {err['msg']}", "body")
    where = ".".join(str(x) for x in err.get("loc", ()) if x not in _REQUEST_PARTS) or default_field
    return Invalid(prefix + str(err["msg"]), where)


def refusal(exc: ValidationError, prefix: str = "") -> ServiceError:
    """A pydantic error as the service's refusal (first_problem)."""
    return first_problem(exc.errors(), prefix)


def document_refusal(exc: RunDirError | ValidationError, prefix: str = "") -> ServiceError:
    """A pattern document the engine's parser refused: another schema is invalid, anything else (not
    JSON, not an object) malformed; a field's problem as refusal says it."""
    if isinstance(exc, ValidationError):
        return refusal(exc, prefix)
    kind = Invalid if exc.field == "schema" else Malformed
    return kind(prefix + exc.message, exc.field or "body")


def parse_hang(body: bytes) -> HangSnapshot:
    try:
        return HangSnapshot.model_validate_json(body)
    except ValidationError as exc:
        raise refusal(exc) from exc
