"""`eroica draft DIAGNOSIS.json [--repo PATH] [--backend offline|openai] -o OUT_DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path

from eroica.assistant.backends import ModelSettings
from eroica.assistant.draft import draft_all, load_diagnosis


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft", help="draft change requests (never applied) for a diagnosis's findings")
    p.add_argument("diagnosis", type=Path, help="an eroica.diagnosis/v1 JSON file (eroica diagnose --format json)")
    p.add_argument("--repo", type=Path, help="the training code's repository (drafted diffs must apply to it)")
    p.add_argument("--backend", choices=("offline", "openai"), default="offline")
    p.add_argument("--base-url", help="openai backend: the endpoint (or EROICA_LLM_BASE_URL)")
    p.add_argument("--model", help="openai backend: the model name (or EROICA_LLM_MODEL)")
    p.add_argument("--redact", action="append", default=[], help="a regular expression never sent to a model")
    p.add_argument("-o", "--output", type=Path, required=True, help="directory for the change requests")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        d = load_diagnosis(args.diagnosis)
        settings = ModelSettings.from_env(args.base_url, args.model) if args.backend == "openai" else None
    except ValueError as exc:
        print(f"eroica draft: {exc}")
        return 2
    if args.repo is not None and not args.repo.is_dir():
        print(f"eroica draft: --repo {args.repo}: not a directory")
        return 2
    outcomes = draft_all(d, args.output, args.repo, args.backend, settings, args.redact)
    for o in outcomes:
        why = f" ({o.refusal})" if o.refusal else ""
        print(f"{o.kind:7s} {o.finding}: {o.directory}{why}")
    if not outcomes:
        print("no finding at >= 0.5 confidence: nothing to draft")
    print(f"nothing was applied; review the change requests under {args.output}")
    return 0
