"""Project policies: packaging, layering, taxonomy and runbooks."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).parents[2]
LAYERS = {"schema": -1, "collector": 0, "engine": 1, "assistant": 2, "service": 3, "lab": 4, "cli": 5}  # lab: test jobs
# documents are the interface: the engine reads what the collector writes through eroica.schema alone
NOT_IMPORTED = {"engine": {"collector"}, "assistant": {"collector"}}


def test_every_package_folder_is_declared() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(cfg["packages"])
    found = set()
    for pkg, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found == declared


def test_imports_flow_one_way_and_durable_rules_is_imported_once() -> None:
    durable_importers = []
    for folder, level in LAYERS.items():
        for py in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(py.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for n in names:
                    if n.startswith("durable"):
                        durable_importers.append(py.relative_to(ROOT).as_posix())
                    parts = n.split(".")
                    if parts[0] == "eroica" and len(parts) > 1 and parts[1] in LAYERS:
                        assert LAYERS[parts[1]] <= level, f"{py}: {folder} must not import {n}"
                        assert parts[1] not in NOT_IMPORTED.get(folder, set()), f"{py}: {folder} must not import {n}"
    assert sorted(set(durable_importers)) == ["engine/rules/_durable.py"]


#: the engine's public doors: what code outside the engine may import of it
ENGINE_DOORS = ("eroica.engine", "eroica.engine.rules")


def test_nothing_outside_the_engine_imports_more_than_its_doors() -> None:
    """A module inside the engine can move or change without touching its users: the service, the
    assistant, the CLI, the lab jobs and the benchmarks reach it through eroica.engine (and the rule
    tooling through eroica.engine.rules), never through one of its modules."""
    through = []
    for folder in [*(f for f in LAYERS if f != "engine"), "bench"]:
        for py in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(py.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                through += [f"{py.relative_to(ROOT)}: {n}" for n in names
                            if n.startswith("eroica.engine.") and n not in ENGINE_DOORS]
    assert through == []


def test_each_name_at_the_engines_doors_is_what_it_names_even_after_every_module_is_imported() -> None:
    import importlib
    import pkgutil
    import types

    import eroica.engine
    import eroica.engine.rules

    for pkg in (eroica.engine, eroica.engine.rules):     # a module imported sets its name on the package
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if not info.name.endswith("._durable"):
                importlib.import_module(info.name)
        for name in pkg.__all__:
            value = getattr(pkg, name)
            assert not isinstance(value, types.ModuleType), f"{pkg.__name__}.{name} is a module, not the door's name"
        exec(f"from {pkg.__name__} import *", {})          # every name resolves


def test_modules_stay_small_and_there_is_no_utils() -> None:
    for folder in [*LAYERS, "knowledge"]:
        for py in (ROOT / folder).rglob("*.py"):
            assert py.name != "utils.py"
            assert len(py.read_text().splitlines()) <= 500, f"{py} is over 500 lines: split it"


def test_knowledge_has_no_code_but_its_init() -> None:
    assert [p.name for p in (ROOT / "knowledge").rglob("*.py")] == ["__init__.py"]


def test_every_taxonomy_id_has_a_runbook_and_the_contract_ids_exist() -> None:
    tax = yaml.safe_load((ROOT / "knowledge" / "taxonomy.yaml").read_text())["root_causes"]
    contract = {"dataloader_stall", "cpu_contention", "cpu_throttled", "gpu_throttled", "pcie_degraded",
                "nvlink_degraded", "nic_degraded", "workload_imbalance", "gc_pause", "slow_storage",
                "host_memory_pressure", "framework_config", "user_code", "unknown"}
    assert contract <= set(tax)
    for k, v in tax.items():
        assert v["category"] in ("hardware", "software"), k
        assert (ROOT / "knowledge" / v["runbook"]).is_file(), f"{k}: runbook {v['runbook']} missing"


def test_the_collector_needs_only_the_base_install_at_import() -> None:
    """`pip install eroica` (no extra) is what runs in a training job: the collector's and the schema's
    module-level imports are the standard library, the base dependencies and themselves; torch and NVML
    only inside functions, where their absence is a gap (tests/install/test_wheel.py installs it for real)."""
    import sys

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {"pydantic": "pydantic", "numpy": "numpy", "psutil": "psutil", "pyyaml": "yaml", "msgspec": "msgspec"}
    assert {d.split(">")[0].split("=")[0].split("<")[0] for d in cfg["dependencies"]} == set(base)
    allowed = set(sys.stdlib_module_names) | set(base.values()) | {"eroica", "__future__"}
    for folder in ("collector", "schema"):
        for py in (ROOT / folder).rglob("*.py"):
            for node in ast.parse(py.read_text()).body:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                for n in names:
                    assert n.split(".")[0] in allowed, f"{py}: imports {n} at module level (not in the base install)"
                    if n.startswith("eroica."):
                        assert n.split(".")[1] in ("collector", "schema"), f"{py}: imports {n}"
