"""The rule vocabulary is the code's: the signal catalog (eroica.schema.signals) names what the collector
really fills and the sources it really has, every gap source the collector writes is known, and the
engine's signal lists are the catalog's. So `eroica rules lint` refuses exactly the names nothing produces."""

from __future__ import annotations

import re
from pathlib import Path

from eroica.collector import loader_workers, nvml, proc_sources
from eroica.engine.facts import FACT_TYPES
from eroica.engine.rules.vocabulary import domains
from eroica.engine.signals import GPU_SIGNALS, HW_SIGNALS
from eroica.schema.patterns import HardwareSummary
from eroica.schema.signals import GAP_SOURCES, SIGNALS

ROOT = Path(__file__).parents[2]


def _source_names() -> set[str]:
    out = set()
    for module in (proc_sources, nvml, loader_workers):
        for obj in vars(module).values():
            name = getattr(obj, "__dataclass_fields__", {}).get("name")
            if name is not None and isinstance(name.default, str):
                out.add(name.default)
    return out


def _gpu_keys() -> set[str]:
    """The GPU summary keys the collector can write: NVML's probes and its sources' columns, and the
    names the summary derives from counters (collector/summarize.py)."""
    text = (ROOT / "collector" / "nvml.py").read_text() + (ROOT / "collector" / "summarize.py").read_text()
    return set(re.findall(r'"(gpu_[a-z_]+)"', text))


def test_every_signal_is_one_the_collector_fills_from_a_source_it_has() -> None:
    fields = set(HardwareSummary.model_fields)
    sources = _source_names()
    for s in SIGNALS:
        if s.scope == "NVML":
            assert s.name in _gpu_keys(), f"{s.name}: the collector writes no such GPU key"
        else:
            assert s.name in fields, f"{s.name}: not a HardwareSummary field"
        assert s.source in sources, f"{s.name}: no collector source is named {s.source!r} ({sorted(sources)})"


def test_the_engines_signals_are_the_catalogs_and_the_hardware_summary_has_no_uncatalogued_signal() -> None:
    assert (*HW_SIGNALS, *GPU_SIGNALS) == tuple(s.name for s in SIGNALS if s.stated_as == "hw_signal")
    assert domains()["signal"] == (*HW_SIGNALS, *GPU_SIGNALS)
    catalogued = {s.name for s in SIGNALS}
    scalar = {n for n, f in HardwareSummary.model_fields.items() if "float" in str(f.annotation)
              and (n.endswith(("_ratio", "_per_second", "_bytes", "_cores")))}
    # carried for the report and the quota rule's context, never compared across ranks
    assert scalar - catalogued <= {"rss_bytes", "cgroup_cpu_quota_cores", "per_core_util_ratio"}, scalar - catalogued


def test_every_gap_source_the_collector_writes_is_known() -> None:
    text = "\n".join(p.read_text() for p in (ROOT / "collector").rglob("*.py"))
    written = set(re.findall(r'(?:source=|_gap\(|_warn\(|_disable\()"([a-z_.]+)"', text))
    assert written, "the pattern found no gap source: update this test with the collector"
    assert written <= set(GAP_SOURCES), written - set(GAP_SOURCES)
    assert _source_names() <= set(GAP_SOURCES)          # a sampler source that fails is a gap of its name


def test_every_closed_field_names_a_set_the_vocabulary_has() -> None:
    sets = domains()
    for kind, model in FACT_TYPES.items():
        for name, f in model.model_fields.items():
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            if "domain" in extra:
                assert extra["domain"] in sets, f"{kind}.{name}: no set named {extra['domain']!r}"
