"""`eroica draft DIAGNOSIS.json [--repo PATH] [--backend offline|openai] -o OUT_DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path

from eroica.assistant.backends import ModelSettings
from eroica.assistant.draft import Options, draft_all, load_diagnosis
from eroica.assistant.redact import load_pattern_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("diagnosis", type=Path, help="an eroica.diagnosis/v1 JSON file (eroica diagnose --format json)")
    p.add_argument("--repo", type=Path, help="the training code's repository (drafted diffs must apply to it)")
    p.add_argument("--backend", choices=("offline", "openai"), default="offline")
    p.add_argument("--base-url", help="openai backend: the endpoint (or EROICA_LLM_BASE_URL)")
    p.add_argument("--model", help="openai backend: the model name (or EROICA_LLM_MODEL)")
    p.add_argument("--redact", action="append", default=[], help="a regular expression never sent to a model")
    p.add_argument("--redact-file", type=Path, help="a file of such expressions, one per line (or EROICA_REDACT_FILE)")
    p.add_argument("--validate", help="the repository's validation command, run by the gate on each drafted diff in "
                                      "a scratch copy (default: [tool.eroica] validate in the repo's pyproject.toml)")
    p.add_argument("--validate-timeout", type=float, default=300.0, help="seconds (default 300)")
    p.add_argument("--unsandboxed-validation", action="store_true",
                   help="run the validation command even where no sandbox (bubblewrap) can: it then runs the "
                        "draft and the repository's tests with your files and network (the change request says so)")
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
    try:
        patterns = [*args.redact, *(load_pattern_file(args.redact_file) if args.redact_file else [])]
    except ValueError as exc:
        print(f"eroica draft: {exc}")
        return 2
    outcomes = draft_all(d, args.output, options=Options(
        repo=args.repo, backend=args.backend, settings=settings, redact_patterns=patterns, validate=args.validate,
        validate_timeout_seconds=args.validate_timeout, sandboxed_validation=not args.unsandboxed_validation))
    for o in outcomes:
        why = f" ({o.refusal})" if o.refusal else ""
        where = f" at {o.target}" if o.target and o.kind == "code" else ""
        print(f"{o.kind:7s} {o.finding}{where}: {o.directory}{why}")
    if not outcomes:
        print("no finding at >= 0.5 confidence: nothing to draft")
    print(f"nothing was applied; review the change requests under {args.output}")
    return 0
