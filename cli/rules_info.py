"""What `eroica rules list|show|vocabulary|coverage` print: the knowledge as a person reads it (text,
Markdown tables for the docs) or as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from eroica.engine import Knowledge
from eroica.engine.rules import SAFE_LOADER, FieldSpec, RuleEntry, Vocabulary
from eroica.schema.diagnosis import FACTORS


def _cause(e: RuleEntry) -> str:
    r = e.written.rule
    return r.taxonomy or f"derives {(r.emit.derive or {}).get('kind', '?')}"


def _row(e: RuleEntry) -> dict[str, Any]:
    r = e.effective.rule
    return {"id": e.id, "status": r.status.value, "root_cause": _cause(e), "origin": e.origin, "path": e.written.path,
            "enabled": e.enabled, "why_disabled": e.why_disabled or None, "replaces": e.replaces or None,
            "override": e.override or None, "prior": r.emit.confidence, "prior_from": e.prior}


def list_rules(k: Knowledge, fmt: str) -> str:
    rows = [_row(e) for e in sorted(k.entries, key=lambda e: e.id)]
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    w = max((len(r["id"]) for r in rows), default=2)
    c = max((len(r["root_cause"]) for r in rows), default=10)
    lines = [f"{'id':<{w}}  {'on':<3}  {'status':<12}  {'root cause':<{c}}  {'prior':>5}  {'origin'}"]
    for r in rows:
        notes = [x for x in (f"DISABLED ({r['why_disabled']})" if not r["enabled"] else "",
                             f"replaces {r['replaces']}" if r["replaces"] else "",
                             f"override {r['override']}" if r["override"] and r["enabled"] else "") if x]
        lines.append(f"{r['id']:<{w}}  {'yes' if r['enabled'] else 'OFF':<3}  {r['status']:<12}  "
                     f"{r['root_cause']:<{c}}  {r['prior']:>5.2f}  {r['origin']}"
                     + ("".join(f"\n{'':<{w}}       - {n}" for n in notes)))
    on = sum(r["enabled"] for r in rows)
    origins = sorted({r["origin"] for r in rows})
    lines.append(f"{len(rows)} rule(s), {on} enabled, from {', '.join(origins)}")
    return "\n".join(lines) + "\n"


def _incidents(ids: list[str], libs: list[Path]) -> list[str]:
    out = []
    for inc in ids:
        roots = [d for lib in libs for d in (lib, lib / "heldout")]
        where = next((d / inc for d in roots if (d / inc / "expected.yaml").exists()), None)
        if where is None:
            out.append(f"{inc} (not in {', '.join(map(str, libs)) or 'any library given'})")
            continue
        exp = yaml.load((where / "expected.yaml").read_text(), Loader=SAFE_LOADER) or {}
        causes = [f"{e.get('root_cause')} on rank {', '.join(map(str, e.get('ranks') or []))}"
                  for e in exp.get("expect") or []]
        out.append(f"{inc} ({where}): expects {'; '.join(causes) or 'no finding (healthy)'}")
    return out


def show_rule(k: Knowledge, rule_id: str, libs: list[Path], fmt: str) -> str | None:
    e = k.entry(rule_id)
    if e is None:
        return None
    r = e.effective.rule
    tax = k.taxonomy.get(r.taxonomy or "")
    applies = {"peer_group_ratio": r.emit.basis == "peers", "evidence_gap_ratio": bool(r.emit.needs),
               "explained_away_ratio": bool(tax and (tax.generic or tax.explained_by))}
    factors = [(name, label, how) for name, label, _, how in FACTORS if applies.get(name, True)]
    chain = [ir.id for ir in k.irs if ir.derived_kind and ir.derived_kind in {c.fact for c in r.when}]
    if fmt == "json":
        return json.dumps({**_row(e), "title": r.title, "owner": r.owner, "basis": r.emit.basis,
                           "needs": list(r.emit.needs), "derived_from": chain,
                           "factors": [{"factor": n, "label": lb, "how": h} for n, lb, h in factors],
                           "tests": [{"name": t.name, "fires": bool(t.expect)} for t in r.tests],
                           "incidents": _incidents(list(r.incidents), libs)}, indent=2) + "\n"
    out = [f"{e.id}: {r.title}", f"  file:       {e.written.path}", f"  origin:     {e.origin}",
           f"  status:     {r.status.value}, {'enabled' if e.enabled else 'DISABLED: ' + e.why_disabled}",
           f"  owner:      {r.owner}"]
    if r.taxonomy:
        out.append(f"  root cause: {r.taxonomy}" + (f" ({tax.category}: {tax.component}) - {tax.question}" if tax
                                                   else " (not in the taxonomy)"))
    else:
        out.append(f"  derives:    {(r.emit.derive or {}).get('kind')} (a hypothesis other rules consume; a "
                   "derivation's confidence is not a finding's)")
    if chain:
        out.append(f"  consumes what {', '.join(chain)} derive{'s' if len(chain) == 1 else ''}")
    if e.replaces:
        out.append(f"  replaces:   {e.replaces}")
    if e.override:
        out.append(f"  override:   {e.override}")
    out += ["", f"Its confidence as reported: the product of these factors (basis: {r.emit.basis}"
                + (f"; needs {', '.join(r.emit.needs)} x {r.emit.missing_evidence_factor:g} where missing"
                   if r.emit.needs else "") + "):",
            f"  prior            {r.emit.confidence:.2f}: {e.prior}"]
    out += [f"  x {label:<15}{how}" for name, label, how in factors if name != "rule_ratio"]
    out += ["", f"Tests ({len(r.tests)}):"] + [f"  {'fires' if t.expect else 'quiet'}: {t.name}" for t in r.tests]
    out += ["", "Incidents it names:"] + [f"  {x}" for x in _incidents(list(r.incidents), libs) or ["(none)"]]
    out += ["", "As written:", Path(e.written.path).read_text().rstrip()]
    if e.effective.rule != e.written.rule:
        why = f"the override at {e.override}" if e.override else "its fitted prior"
        out += ["", f"As it runs here ({why}):", "when:"]
        out += [f"  - {json.dumps({'fact': c.fact, **({'as': c.as_} if c.as_ else {}), 'where': c.where})}"
                for c in r.when]
        out.append(f"emit.confidence: {r.emit.confidence:g}")
    return "\n".join(out) + "\n"


def _range(f: FieldSpec) -> str:
    if f.values:
        return "one of: " + ", ".join(f.values)
    return f.range_text()


def vocabulary(v: Vocabulary, fmt: str, sections: list[str] | None = None) -> str:
    data = v.as_json()
    want = set(sections or data)
    if fmt == "json":
        return json.dumps({k: x for k, x in data.items() if k in want}, indent=2) + "\n"
    md = fmt == "md"
    out: list[str] = []
    if "facts" in want:
        for ks in v.kinds.values():
            head = (f"{ks.kind} ({'hypothesis, derived by ' + (', '.join(ks.derived_by) or 'no loaded rule')}"
                    if ks.hypothesis else f"{ks.kind} (measured") + f"; stated in a {ks.context})"
            out += _table(head, ks.description, ("field", "type", "unit", "values"),
                          [(f.name, f.type, f.unit or "", _range(f)) for f in ks.fields.values()], md)
    if "signals" in want:
        out += _table("hardware signals", "what the collector samples on each rank; `hw_signal.signal` takes the "
                      "names stated as hw_signal", ("signal", "unit", "source", "scope", "read from", "stated as"),
                      [(s.name, s.unit, s.source, s.scope, s.where, s.stated_as) for s in v.signals], md)
    if "domains" in want:
        out += _table("domains", "the closed sets of values a field can take (its `values` above name them)",
                      ("set", "values"), [(k, ", ".join(vals)) for k, vals in v.domains.items()], md)
    if "gap_sources" in want:
        out += _table("gap sources", "what `evidence_gap.source` and a rule's `emit.needs` name",
                      ("source", "what is missing"), list(v.gap_sources.items()), md)
    if "root_causes" in want:
        out += _table("root causes", "the taxonomy's ids (a rule's `taxonomy:`), with the site's",
                      ("root cause", "category", "component"),
                      [(k, e.category, e.component) for k, e in v.root_causes.items()], md)
    return "\n".join(out)


def _table(title: str, note: str, head: tuple[str, ...], rows: Sequence[Sequence[str]], md: bool) -> list[str]:
    if md:
        cells = [" | ".join(f"`{c}`" if i == 0 else c.replace("|", "\\|") for i, c in enumerate(r)) for r in rows]
        return [f"#### {title}", "", note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                *(f"| {c} |" for c in cells), ""]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt_row = lambda r: "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [f"{title}: {note}" if note else title, fmt_row(head), *map(fmt_row, rows), ""]


def coverage_text(cov: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(cov.as_json(), indent=2) + "\n"
    lines = [f"{len(cov.incidents)} incident(s) replayed with {len(cov.rules)} enabled rule(s)", "",
             f"  {'rule':<40} {'fires in':>8} {'decides':>8}  incidents where it decides (else where it fires)"]
    for rid, row in sorted(cov.rules.items(), key=lambda kv: (-len(kv[1].decides), -len(kv[1].fires), kv[0])):
        shown = row.decides or row.fires
        lines.append(f"  {rid:<40} {len(row.fires):>8} {len(row.decides):>8}  "
                     + (", ".join(shown[:6]) + (f" (+{len(shown) - 6})" if len(shown) > 6 else "")))
    never = [rid for rid, row in cov.rules.items() if not row.fires and rid not in cov.hang_rules]
    hang = [rid for rid in cov.hang_rules if not cov.rules[rid].fires]
    lines += ["", f"never fired: {', '.join(sorted(never)) or 'none'}"]
    if hang:
        lines.append(f"hang rules (they read a hang's snapshots, which a window's incident does not hold): "
                     f"{', '.join(hang)}")
    return "\n".join(lines) + "\n"
