"""`eroica eval [DIR]`: replay every recorded incident and print the diagnosis-yield table."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median

from eroica.cli import knowledge_args
from eroica.engine import (
    HELDOUT,
    MIN_FINDINGS,
    DiagnoseOptions,
    EngineError,
    IncidentResult,
    KnowledgeSpec,
    RuleError,
    RunDirError,
    calibration,
    evaluate_incident,
    find_heldout,
    find_incidents,
    library_fits,
    load_expected,
    naming_rules,
    write_priors,
)
from eroica.engine import load_knowledge as load
from eroica.engine.rules import builtin_knowledge_dir, load_rules


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", type=Path, default=Path("incidents"),
                   help="a library of incidents (its heldout/ folder scored apart), or a folder named heldout (scored "
                        "as held-out: unseen first, seen apart). Exit 1 when a library incident fails, 2 on bad "
                        "input; held-out misses never fail (default: incidents)")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per incident")
    p.add_argument("--calibration", action="store_true",
                   help="also print a reliability table (confidence bins vs share right) and the Brier score")
    p.add_argument("--fit-priors", action="store_true",
                   help="fit each rule's prior on the library (never on heldout/), write knowledge/priors.yaml, and "
                        "print the calibration before and after on both sets")
    p.add_argument("--drafts", action="store_true",
                   help="the draft yield instead: draft every code fix of the library's software findings on every "
                        "repository under DIR/repos (or --repos), through the gate with each repository's validation")
    p.add_argument("--repos", type=Path, help="--drafts: the training repositories (default DIR/repos)")
    p.add_argument("--no-validate", action="store_true", help="--drafts: skip the repositories' validation commands")
    p.add_argument("--base-url", help="--drafts: also ask this OpenAI-compatible model endpoint to draft for the "
                                      "causes templates do not fix (unknown, transient_stall) and user_code, and "
                                      "count what the gate accepts (EROICA_LLM_* settings apply)")
    p.add_argument("--model", help="--drafts --base-url: the model's name at the endpoint")
    knowledge_args.add(p)
    p.set_defaults(func=run)


def drafts(args: argparse.Namespace) -> int:
    from eroica.assistant.draft_yield import draft_yield
    from eroica.assistant.draft_yield import table as draft_table
    repos = args.repos or args.dir / "repos"
    if not repos.is_dir():
        print(f"eroica eval --drafts: {repos}: no such folder of training repositories (each with eroica-eval.yaml)",
              file=sys.stderr)
        return 2
    try:
        ev = draft_yield(args.dir, repos, validate=not args.no_validate,
                      progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    except (ValueError, KeyError, OSError) as exc:
        print(f"eroica eval --drafts: {exc}", file=sys.stderr)
        return 2
    print(f"draft yield ({args.dir}: software findings whose fix is code, x {repos}: training repositories)")
    print(draft_table(ev))
    drafted, should, wrong, _none = ev.counts()
    if args.base_url:
        from eroica.assistant.backends import ModelSettings
        from eroica.assistant.errors import BackendConfigError
        from eroica.assistant.model_yield import model_yield
        from eroica.assistant.model_yield import table as model_table
        try:
            settings = ModelSettings.from_env(args.base_url, args.model)
        except BackendConfigError as exc:
            print(f"eroica eval --drafts: {exc}", file=sys.stderr)
            return 2
        print()
        print(model_table(model_yield(args.dir, repos, settings, validate=not args.no_validate,
                                      progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))))
    return 0 if drafted == should and wrong == 0 else 1


def table(results: list[IncidentResult], label: str = "overall yield") -> str:
    by: dict[str, list[IncidentResult]] = defaultdict(list)
    for r in results:
        for c in r.causes or ["(heterogeneous)" if r.heterogeneous else "(healthy)"]:
            by[c].append(r)
    lines = [f"{'root cause':<22}{'incidents':>10}{'correct':>9}{'yield':>8}{'false':>7}"
             f"{'onset->window (steps)':>24}{'window':>8}"]
    for cause in sorted(by, key=lambda c: (c.startswith("("), c)):
        rs = by[cause]
        ok = sum(r.correct for r in rs)
        false = sum(r.false_findings for r in rs)
        lat = [r.onset_to_window_steps for r in rs if r.onset_to_window_steps is not None]
        win = [r.window_steps for r in rs if r.window_steps is not None]
        lat_s = f"{median(lat):.0f} (max {max(lat)})" if lat else "-"
        lines.append(f"{cause:<22}{len(rs):>10}{ok:>9}{ok / len(rs):>8.0%}{false:>7}{lat_s:>24}"
                     f"{(f'{median(win):.0f}' if win else '-'):>8}")
    faulty = [r for r in results if not r.healthy]
    healthy = [r for r in results if r.healthy and not r.heterogeneous]
    hetero = [r for r in results if r.healthy and r.heterogeneous]
    ok = sum(r.correct for r in faulty)
    lines.append("")
    lines.append(f"faulty incidents diagnosed correctly: {ok}/{len(faulty)}"
                 f" ({ok / len(faulty):.1%})" if faulty else "no faulty incidents")
    hidden = [r.id for r in faulty if r.present_not_costly]
    if hidden:
        lines.append(f"  of the misses, the right cause on the right ranks, present at >= min confidence but "
                     f"costing little or nothing (not counted): {len(hidden)} ({', '.join(hidden)})")
    lines.append(f"healthy runs with a finding at >= min confidence: "
                 f"{sum(1 for r in healthy if r.false_findings)}/{len(healthy)}"
                 f" ({sum(r.false_findings for r in healthy)} finding(s))")
    if hetero:
        lines.append(f"by-design heterogeneous runs with a finding at >= min confidence: "
                     f"{sum(1 for r in hetero if r.false_findings)}/{len(hetero)}"
                     f" ({sum(r.false_findings for r in hetero)} finding(s))")
    before = sum(r.false_findings for r in faulty)
    if before:
        lines.append(f"confident false findings in faulty runs (other ranks or causes, or before the onset): "
                     f"{before}")
    total = sum(r.correct for r in results)
    lines.append(f"{label}: {total}/{len(results)} ({total / len(results):.1%})" if results else "")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.drafts:
        return drafts(args)
    # a held-out folder named directly is judged as held-out, not as a library
    named = "held-out" if args.dir.resolve().name == HELDOUT else "library"
    try:
        incs = find_incidents(args.dir)
        held = find_heldout(args.dir)
        # a bad expected.yaml is named before anything is replayed; a held-out case must say whether it was seen
        for inc in incs + held:
            exp = load_expected(inc / "expected.yaml")
            if exp.seen is None and (named == "held-out" or inc in held):
                raise RunDirError("a held-out case says whether it was seen: add `seen: false` (never read "
                                  "before a change) or `seen: true` with `seen_why:`", path=str(inc / "expected.yaml"))
    except EngineError as exc:
        print(f"eroica eval: {exc}", file=sys.stderr)
        return 2
    if not incs and not held:
        print(f"eroica eval: no incidents (folders with expected.yaml) under {args.dir}", file=sys.stderr)
        return 2
    if args.fit_priors:
        if args.knowledge:
            print("eroica eval --fit-priors: priors are fitted for the shipped rules alone; drop --knowledge",
                  file=sys.stderr)
            return 2
        return fit(args, incs, held)
    try:
        k = load(knowledge_args.spec(args))
    except RuleError as exc:
        print("eroica eval: the knowledge has problems (`eroica rules lint` lists the same):\n"
              + "\n".join(exc.problems), file=sys.stderr)
        return 2
    opts = DiagnoseOptions(in_process=True, knowledge=k.spec)
    named_by = naming_rules(k.rules)
    results = _replay(incs, args.verbose, named, opts, named_by)
    if incs and named == "held-out":
        print(held_out_tables(results, args.dir, args.calibration))
    elif incs:
        print(f"library ({args.dir}: the incidents the rules are written and tested against)")
        print(table(results, "overall yield"))
        if args.calibration:
            print(calibration_table(results))
    if held:
        held_results = _replay(held, args.verbose, "held-out", opts, named_by)
        print()
        print(held_out_tables(held_results, args.dir / HELDOUT, args.calibration, gating=False))
    # the library gates; the held-out yield is a measurement (a held-out folder named directly exits 0 too)
    return 0 if named == "held-out" or all(r.correct for r in results) else 1


def held_out_tables(results: list[IncidentResult], where: Path, calibration: bool, gating: bool = True) -> str:
    """The held-out yield with the unseen cases as its headline (never read before a change: the measure of
    how the rules generalize) and the seen ones apart (read before a change, or recorded for one)."""
    unseen, seen = [r for r in results if not r.seen], [r for r in results if r.seen]
    note = "" if gating else "; reported, not gating"
    out = []
    if unseen:
        out += [f"held-out, unseen ({where}: another job, never read before a change{note})",
                table(unseen, "held-out yield, unseen" + ("" if gating else " (not gating)"))]
    if seen:
        out += ["", f"held-out, seen ({where}: read before a change or recorded for it; each expected.yaml says "
                    "why; not a measure of generalization)", table(seen, "held-out yield, seen")]
    right = sum(r.correct for r in results)
    out += ["", f"held-out yield, all: {right}/{len(results)} (unseen {sum(r.correct for r in unseen)}/{len(unseen)}, "
                f"seen {sum(r.correct for r in seen)}/{len(seen)})"]
    if calibration:
        out.append(calibration_table(results))
    return "\n".join(out)


def calibration_table(results: list[IncidentResult]) -> str:
    rows, brier = calibration(results)
    lines = ["", "calibration (every finding of the judged windows)",
             f"{'confidence':<12}{'findings':>10}{'mean conf':>11}{'right':>8}"]
    lines += [f"{rng:<12}{n:>10}{mean:>11.2f}{right:>8.0%}" for rng, n, mean, right in rows]
    lines.append(f"Brier score: {brier:.3f} (0 is perfect)" if brier is not None else "no findings")
    return "\n".join(lines)


def fit(args: argparse.Namespace, incs: list[Path], held: list[Path]) -> int:
    if not incs:
        print(f"eroica eval --fit-priors: no library incidents under {args.dir}", file=sys.stderr)
        return 2
    hand = DiagnoseOptions(in_process=True, knowledge=KnowledgeSpec(fitted_priors=False))
    before = _replay(incs, args.verbose, "library, hand-set priors", hand)
    fits, samples = library_fits(before)
    path = builtin_knowledge_dir() / "priors.yaml"
    write_priors(path, fits, f"{args.dir.name} ({len(incs)} incidents; {samples} findings)")
    print(f"wrote {path}: {len(fits)} rule(s) fitted (the others have fewer than {MIN_FINDINGS} findings)")
    print(f"{'rule':<30}{'hand-set':>9}{'fitted':>8}{'findings':>10}{'right':>7}")
    for f in fits:
        print(f"{f.rule_id:<30}{f.hand_set:>9.2f}{f.prior:>8.2f}{f.findings:>10}{f.right:>7}")
    after = _replay(incs, args.verbose, "library, fitted priors")
    sets = [("library", before, after)]
    if held:
        sets.append(("held-out (never fitted on)", _replay(held, args.verbose, "held-out, hand-set priors", hand),
                     _replay(held, args.verbose, "held-out, fitted priors")))
    for name, b, a in sets:
        for when, rs in (("before fitting", b), ("after fitting", a)):
            print(f"\n{name}, {when}: yield {sum(r.correct for r in rs)}/{len(rs)}", end="")
            print(calibration_table(rs))
    return 0 if all(r.correct for r in after) else 1


def _replay(incs: list[Path], verbose: bool, label: str, opts: DiagnoseOptions | None = None,
            named: dict[str, list[tuple[str, str]]] | None = None) -> list[IncidentResult]:
    named = named if named is not None else naming_rules(load_rules())
    results = []
    for i, inc in enumerate(incs, 1):
        r = evaluate_incident(inc, opts or DiagnoseOptions(in_process=True), named.get(inc.name))
        results.append(r)
        if verbose or not r.correct:
            mark = "ok  " if r.correct else "FAIL"
            kind = ', '.join(r.causes) or ("heterogeneous" if r.heterogeneous else "healthy")
            why = "" if r.correct else ": " + "; ".join(r.reasons)
            seen = " [seen]" if r.seen and label.startswith("held-out") else ""
            print(f"[{label} {i}/{len(incs)}] {mark} {r.id}{seen} ({kind}){why}")
    return results
