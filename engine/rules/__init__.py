"""eroica.engine.rules: the rule base, and the door for those who author and test rules (the CLI's
`eroica rules ...`): everything outside the engine imports its rule tooling from here. Names resolve
when first used, so the engine's own modules import their neighbours here without cost."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> (module under eroica.engine.rules, its name there)
_DOOR: dict[str, tuple[str, str]] = {
    **{n: ("authoring", n) for n in ("lint", "cases", "given_facts", "expect_problems")},
    "compile_rules": ("compiler", "compile_rules"),
    "load_rules": ("loader", "load_rules"),
    "run_tests": ("runner", "run_tests"),
    **{n: ("scaffolding", n) for n in ("scaffold", "ScaffoldError")},
    **{n: ("source", n) for n in ("SAFE_LOADER", "builtin_knowledge_dir")},
    **{n: ("vocabulary", n) for n in ("Vocabulary", "FieldSpec")},
    **{n: ("layers", n) for n in ("ENV", "RuleEntry")},
}

__all__ = list(_DOOR)

if TYPE_CHECKING:
    from eroica.engine.rules.authoring import cases as cases
    from eroica.engine.rules.authoring import expect_problems as expect_problems
    from eroica.engine.rules.authoring import given_facts as given_facts
    from eroica.engine.rules.authoring import lint as lint
    from eroica.engine.rules.compiler import compile_rules as compile_rules
    from eroica.engine.rules.layers import ENV as ENV
    from eroica.engine.rules.layers import RuleEntry as RuleEntry
    from eroica.engine.rules.loader import load_rules as load_rules
    from eroica.engine.rules.runner import run_tests as run_tests
    from eroica.engine.rules.scaffolding import ScaffoldError as ScaffoldError
    from eroica.engine.rules.scaffolding import scaffold as scaffold
    from eroica.engine.rules.source import SAFE_LOADER as SAFE_LOADER
    from eroica.engine.rules.source import builtin_knowledge_dir as builtin_knowledge_dir
    from eroica.engine.rules.vocabulary import FieldSpec as FieldSpec
    from eroica.engine.rules.vocabulary import Vocabulary as Vocabulary


def __getattr__(name: str) -> Any:
    where = _DOOR.get(name)
    if where is None:
        raise AttributeError(f"module 'eroica.engine.rules' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"eroica.engine.rules.{where[0]}"), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
