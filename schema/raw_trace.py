"""A kept raw trace on the wire: which window and rank it is, then the trace itself.

A rank whose window's raw trace was kept (eroica.collector.raw_keep) sends it to the service
(`POST /v1/jobs/{id}/traces`) as one JSON object: the header's fields and `trace`, the Chrome/Perfetto
trace as the collector wrote it. The service keeps a job's newest few and links them from the job's
page, so an engineer can open a suspect's window in Perfetto beside a healthy peer's.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eroica.schema.patterns import MAX_WORLD_SIZE, WINDOW_ID_PATTERN

TRACE_KEY = "trace"


class RawTraceHeader(BaseModel):
    """Which window and rank a kept raw trace is of, and where it ran."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    window_id: str = Field(pattern=WINDOW_ID_PATTERN)
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    host: str | None = Field(None, max_length=255)


def pack(header: RawTraceHeader, trace_json: bytes) -> bytes:
    """The upload's body: the header's fields and `trace` (the trace file's bytes, not parsed again)."""
    head = header.model_dump_json().encode()
    return head[:-1] + b',"' + TRACE_KEY.encode() + b'":' + trace_json.strip() + b"}"


def unpack(body: bytes) -> tuple[RawTraceHeader, dict[str, Any]]:
    """The header (validated) and the trace (a JSON object with a `traceEvents` list); ValueError
    (pydantic's ValidationError is one) naming what is wrong otherwise."""
    try:
        doc = json.loads(body)
    except RecursionError:         # nested deeper than the parser's stack: no trace is
        raise ValueError("the upload is not JSON eroica reads: nested too deep") from None
    if not isinstance(doc, dict):
        raise ValueError("a raw trace upload is a JSON object")
    trace = doc.pop(TRACE_KEY, None)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"'{TRACE_KEY}' must be a Chrome trace: an object with a 'traceEvents' list")
    return RawTraceHeader.model_validate(doc), trace
