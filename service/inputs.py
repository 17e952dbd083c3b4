"""What the API accepts, typed and bounded: an issue's transition here, and the wire documents of
eroica.schema (a step summary, a rank's hang snapshot). Every number fits the columns it is stored
in (a step or rank in 32 bits), every string has a length, and a hang snapshot's parts are typed
down to the fields the engine reads, so a well-formed but hostile document is a 422 naming its
field, never a 500 (which the sink would retry and spool forever)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eroica.schema.hang import MAX_INT, HangSnapshot  # noqa: F401  (routes read MAX_INT here)
from eroica.service.errors import IngestError


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TransitionIn(In):
    who: str = Field(min_length=1, max_length=200)
    why: str | None = Field(None, max_length=4000)
    url: str | None = Field(None, max_length=2000)
    kind: str | None = Field(None, max_length=32)


def refusal(exc: ValidationError) -> IngestError:
    """A pydantic error as the service's 422: the first problem, naming its field."""
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "body"
    if err["type"] == "json_invalid":
        return IngestError(400, f"not JSON: {err['msg']}", "body")
    return IngestError(422, err["msg"], where)


def parse_hang(body: bytes) -> HangSnapshot:
    try:
        return HangSnapshot.model_validate_json(body)
    except ValidationError as exc:
        raise refusal(exc) from exc
