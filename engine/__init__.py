"""eroica.engine: peer comparison, facts and the forward-chaining rule base over pattern documents.

This module is the engine's public door: everything outside the engine imports what it needs from
here (`from eroica.engine import diagnose`), or, to author and test rules, from `eroica.engine.rules`;
nothing else of the engine is imported from outside it (tests/project/test_policy.py says so), so a
module inside can move or change without touching its users.

- Knowledge, loaded and compiled once: `KnowledgeSpec` (shipped, then a site's layers), `Knowledge`,
  `compiled`, `compiled_once`, `compile_knowledge`, `load_knowledge`, `load_taxonomy`, `load_priors`.
- Diagnosis: `diagnose` (a run directory), `diagnose_documents` (windows of documents: `window_of_packs`,
  `parse_doc`, `pack_lines`, `load_run`), `DiagnoseOptions`, `analyze_windows` (the facts the rules
  receive), `localize_documents` (a hang), `liveness` and `waiting` (what a hung run's watchdogs say).
  The result types are eroica.schema.diagnosis's (`Diagnosis`, `WindowDiagnosis`, `Finding`).
- Reports: `render`, `template`, `FORMATS`; a culprit across the job's windows: `story`.
- The incident yield: `find_incidents`, `find_heldout`, `HELDOUT`, `load_expected`, `evaluate_incident`,
  `IncidentResult`, `calibration`, `promotion_candidates`, `library_fits`, `naming_rules`, `write_priors`,
  `MIN_FINDINGS`, `coverage`, `incident_dirs`.
- A process that diagnoses many windows: `load_rule_runtime`, `freeze_startup`, `held_off` (the
  garbage collector held off while a window is diagnosed).
- The columnar form the service keeps of each host batch, so a diagnosis does not parse a document
  twice: `ColumnsBuilder`, `encode_chunk`, `merged_key`.
- Errors: `EngineError`, `RuleError`, `RunDirError`.

Names resolve when first used (PEP 562), so `import eroica.engine` stays as cheap as its constants:
the CLI builds its argument parser from FORMATS without importing the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: eroica's version, as pyproject.toml says (tests/unit/engine/test_rule_cache.py checks they agree);
#: a constant, because reading the installed metadata costs more than a small diagnosis
VERSION = "0.1.0"

#: the report formats (engine/reports.py); here, so the CLI's argument parser needs no engine import
FORMATS = ("text", "json", "md", "html")

#: public name -> (module under eroica.engine, its name there)
_DOOR: dict[str, tuple[str, str]] = {
    **{n: ("pipeline", n) for n in ("diagnose", "diagnose_documents", "DiagnoseOptions", "analyze_windows",
                                    "compile_knowledge")},
    **{n: ("rules.layers", n) for n in ("KnowledgeSpec", "Knowledge", "compiled", "compiled_once")},
    "load_knowledge": ("rules.layers", "load_knowledge"),
    "load_taxonomy": ("taxonomy", "load_taxonomy"),
    **{n: ("priors", n) for n in ("load_priors", "write_priors", "MIN_FINDINGS")},
    **{n: ("load", n) for n in ("load_run", "window_of_packs", "parse_doc", "pack_lines")},
    **{n: ("hang", n) for n in ("localize_documents", "liveness", "waiting")},
    **{n: ("reports", n) for n in ("render", "template")},
    "story": ("job_story", "story"),
    **{n: ("evaluate", n) for n in ("find_incidents", "find_heldout", "HELDOUT", "load_expected",
                                    "evaluate_incident", "IncidentResult", "calibration", "promotion_candidates",
                                    "library_fits", "naming_rules")},
    **{n: ("rule_coverage", n) for n in ("coverage", "incident_dirs")},
    **{n: ("heap", n) for n in ("freeze_startup", "held_off")},
    **{n: ("columns", n) for n in ("ColumnsBuilder", "merged_key")},
    "encode_chunk": ("column_chunks", "encode_chunk"),
    **{n: ("errors", n) for n in ("EngineError", "RuleError", "RunDirError")},
}

__all__ = ["VERSION", "FORMATS", "load_rule_runtime", *_DOOR]

if TYPE_CHECKING:
    from eroica.engine.column_chunks import encode_chunk as encode_chunk
    from eroica.engine.columns import ColumnsBuilder as ColumnsBuilder
    from eroica.engine.columns import merged_key as merged_key
    from eroica.engine.errors import EngineError as EngineError
    from eroica.engine.errors import RuleError as RuleError
    from eroica.engine.errors import RunDirError as RunDirError
    from eroica.engine.evaluate import HELDOUT as HELDOUT
    from eroica.engine.evaluate import IncidentResult as IncidentResult
    from eroica.engine.evaluate import calibration as calibration
    from eroica.engine.evaluate import evaluate_incident as evaluate_incident
    from eroica.engine.evaluate import find_heldout as find_heldout
    from eroica.engine.evaluate import find_incidents as find_incidents
    from eroica.engine.evaluate import library_fits as library_fits
    from eroica.engine.evaluate import load_expected as load_expected
    from eroica.engine.evaluate import naming_rules as naming_rules
    from eroica.engine.evaluate import promotion_candidates as promotion_candidates
    from eroica.engine.hang import liveness as liveness
    from eroica.engine.hang import localize_documents as localize_documents
    from eroica.engine.hang import waiting as waiting
    from eroica.engine.heap import freeze_startup as freeze_startup
    from eroica.engine.heap import held_off as held_off
    from eroica.engine.job_story import story as story
    from eroica.engine.load import load_run as load_run
    from eroica.engine.load import pack_lines as pack_lines
    from eroica.engine.load import parse_doc as parse_doc
    from eroica.engine.load import window_of_packs as window_of_packs
    from eroica.engine.pipeline import DiagnoseOptions as DiagnoseOptions
    from eroica.engine.pipeline import analyze_windows as analyze_windows
    from eroica.engine.pipeline import compile_knowledge as compile_knowledge
    from eroica.engine.pipeline import diagnose as diagnose
    from eroica.engine.pipeline import diagnose_documents as diagnose_documents
    from eroica.engine.priors import MIN_FINDINGS as MIN_FINDINGS
    from eroica.engine.priors import load_priors as load_priors
    from eroica.engine.priors import write_priors as write_priors
    from eroica.engine.reports import render as render
    from eroica.engine.reports import template as template
    from eroica.engine.rule_coverage import coverage as coverage
    from eroica.engine.rule_coverage import incident_dirs as incident_dirs
    from eroica.engine.rules.layers import Knowledge as Knowledge
    from eroica.engine.rules.layers import KnowledgeSpec as KnowledgeSpec
    from eroica.engine.rules.layers import compiled as compiled
    from eroica.engine.rules.layers import compiled_once as compiled_once
    from eroica.engine.rules.layers import load_knowledge as load_knowledge
    from eroica.engine.taxonomy import load_taxonomy as load_taxonomy


def load_rule_runtime() -> None:
    """Import the rule runtime (durable-rules) now, so a process's first diagnosis does not pay it."""
    importlib.import_module("eroica.engine.rules._durable")


def __getattr__(name: str) -> Any:
    where = _DOOR.get(name)
    if where is None:
        raise AttributeError(f"module 'eroica.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"eroica.engine.{where[0]}"), where[1])
    globals()[name] = value           # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
