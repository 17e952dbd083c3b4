"""The `eroica` command: one sub-command group per module, above all four layers.

Only the chosen command's module is imported (the service's, the assistant's and the collector's
imports cost more than a whole trace diagnosis); `eroica --help` lists them all from the table."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

DESCRIPTION = "Find why a distributed training job got slow."

#: command -> (module under eroica.cli, its one line of help); the module's add_arguments defines the rest
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "run a 4-rank CPU training job, inject a fault, diagnose it"),
    "diagnose": ("diagnose_cmd", "diagnose a run directory, or profiler traces (ingested on the way)"),
    "rules": ("rules_cmd", "test or lint the rule base"),
    "record": ("record", "run a real faulty job and keep its window as an incident"),
    "eval": ("eval_cmd", "replay recorded incidents and score diagnosis yield"),
    "schema": ("schema_cmd", "print the JSON Schema of a document eroica writes"),
    "draft": ("draft_cmd", "draft change requests (never applied) for a diagnosis's findings"),
    "ingest": ("ingest_cmd", "turn existing traces into eroica pattern files (then: eroica diagnose)"),
    "simulate": ("simulate", "SIMULATE a window of pattern files for N GPU ranks with one fault"),
    "policy": ("policy_cmd", "the trigger policy: show it, or replay a step-time series through it"),
    "control": ("control_cmd", "change a running job's trigger policy, or ask for a window, without a restart"),
    "serve": ("serve_cmd", "run the online service: ingest windows, diagnose them as they complete, serve the API, "
              "pages and /metrics"),
    "findings": ("findings_cmd", "list findings (issues) of eroica serve and move them through their lifecycle"),
    "run": ("run_cmd", "run a training command unchanged, with every rank watched (zero-code attach)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command's arguments (`only`: just that command's module is imported)."""
    p = argparse.ArgumentParser(prog="eroica", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (module, text) in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"eroica.cli.{module}").add_arguments(sub.add_parser(name, help=text))
    return p


def _overview() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eroica", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_module, text) in COMMANDS.items():
        sub.add_parser(name, help=text)
    return p


#: batch commands whose process may end as soon as their output is flushed (they start no thread
#: and leave no file to clean up after they return)
FAST_EXIT = {"diagnose", "ingest"}


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = _command(argv)
    if cmd not in COMMANDS:
        _overview().parse_args(argv)           # --help, or argparse's error naming the valid commands
        return 2
    args = build_parser(only=cmd).parse_args(argv)
    return int(args.func(args))


def settle() -> None:
    """A batch command has imported what it needs: those modules live as long as the process, so their
    objects are frozen out of every later collection, and collection resumes for the work itself.
    (`entry` holds collection off meanwhile: it rescanned the same import-time objects again and again,
    ~30 ms of a 0.3 s `eroica diagnose` on a small trace.) A no-op where collection is already on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def entry() -> None:
    """The console script. A batch command's process ends once its output is flushed: tearing down
    numpy's, pydantic's and the rule engine's modules takes about 0.2 s, as long as diagnosing a
    small job. Its imports run without cyclic collection (see `settle`, which the command calls)."""
    batch = _command(sys.argv[1:]) in FAST_EXIT
    if batch:
        gc.disable()
    try:
        rc = main()
    finally:
        settle()
    if batch:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
