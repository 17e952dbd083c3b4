"""The knowledge options every command that runs rules takes, said once: `--knowledge DIR` (repeatable,
after `$EROICA_KNOWLEDGE`'s directories), and the spec they build (eroica.engine.rules.layers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eroica.engine import KnowledgeSpec
from eroica.engine.rules import ENV

HELP = (f"a site knowledge directory (rules/, overrides/*.yaml, taxonomy.yaml, hypotheses.yaml), layered over "
        f"the shipped knowledge; repeatable, a later one wins; ${ENV} (os.pathsep-separated) names more, "
        "loaded first. docs/rule-authoring.md")


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--knowledge", type=Path, action="append", default=[], metavar="DIR", help=HELP)


def spec(args: argparse.Namespace, **kw: Any) -> KnowledgeSpec:
    """The knowledge the arguments name: `$EROICA_KNOWLEDGE`, then each --knowledge."""
    return KnowledgeSpec.of(list(getattr(args, "knowledge", None) or []), **kw)
