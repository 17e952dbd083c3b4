"""`eroica schema {diagnosis,patterns,hang,steps,api}`: the JSON Schema of a document of eroica.schema,
generated from the models (`api`: the responses of `eroica serve`'s /v1 API).

The committed copies under docs/schema/ are checked against these by the tests; regenerate with
`eroica schema diagnosis > docs/schema/eroica.diagnosis.v1.schema.json` (and the others).
"""

from __future__ import annotations

import argparse
import json

from pydantic import BaseModel

from eroica.schema.diagnosis import Diagnosis
from eroica.schema.hang import HANG_SCHEMA, HangSnapshot
from eroica.schema.patterns import PatternsDoc
from eroica.schema.steps import StepSeriesSummary

MODELS: dict[str, tuple[type[BaseModel], str]] = {"diagnosis": (Diagnosis, "eroica.diagnosis/v1"),
                                                 "patterns": (PatternsDoc, "eroica.patterns/v1"),
                                                 "hang": (HangSnapshot, HANG_SCHEMA),
                                                 "steps": (StepSeriesSummary, "eroica.steps/v1")}


def schema(kind: str) -> dict[str, object]:
    if kind == "api":
        from pydantic.json_schema import models_json_schema

        from eroica.service.api_models import API_MODELS

        _, defs = models_json_schema([(x, "serialization") for x in API_MODELS])
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "eroica.api/v1",
                "title": "eroica serve /v1 responses", **defs}
    model, sid = MODELS[kind]
    s = model.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": sid, **s}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=sorted([*MODELS, "api"]),
                   help="the document whose schema to print (api: the responses of eroica serve's /v1 API)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.kind), indent=2, sort_keys=True))
    return 0
