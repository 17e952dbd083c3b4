"""The `eroica` command: one sub-command group per module, above all four layers.

Only the chosen command's module is imported (the service's, the assistant's and the collector's
imports cost more than a whole trace diagnosis); `eroica --help` lists them all from the table."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

DESCRIPTION = "Find why a distributed training job got slow."

#: command -> (module under eroica.cli, its one line of help); the module's add_arguments defines the rest
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo_cmd", "run a 4-rank CPU training job, inject a fault, diagnose it"),
    "diagnose": ("diagnose_cmd", "diagnose a run directory, or profiler traces (ingested on the way)"),
    "rules": ("rules_cmd", "the rule base: test, lint, list, show, vocabulary, new, coverage, promote"),
    "record": ("record_cmd", "run a real faulty job and keep its window as an incident"),
    "eval": ("eval_cmd", "replay recorded incidents and score diagnosis yield"),
    "schema": ("schema_cmd", "print the JSON Schema of a document eroica writes"),
    "draft": ("draft_cmd", "draft change requests (never applied) for a diagnosis's findings"),
    "ingest": ("ingest_cmd", "turn existing traces into eroica pattern files (then: eroica diagnose)"),
    "simulate": ("simulate_cmd", "SIMULATE a window of pattern files for N GPU ranks with one fault"),
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


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return f"eroica {version('eroica')} (Python {sys.version.split()[0]})"
    except PackageNotFoundError:
        return f"eroica (not installed as a package; Python {sys.version.split()[0]})"


def _overview() -> argparse.ArgumentParser:
    """`eroica --help`: every command, and the extra a command needs where this Python lacks it."""
    from eroica.cli import extras

    p = argparse.ArgumentParser(prog="eroica", description=DESCRIPTION,
                                epilog="pip install eroica: the collector, `eroica run` and the sink; "
                                       "eroica[engine] diagnosis and reports, eroica[serve] the service, "
                                       "eroica[assistant] the drafts, eroica[all] everything.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_module, text) in COMMANDS.items():
        sub.add_parser(name, help=text + extras.needs_note(name))
    return p


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = _command(argv)
    if cmd not in COMMANDS:
        _overview().parse_args(argv)           # --help, or argparse's error naming the valid commands
        return 2
    from eroica.cli import extras

    if not {"-h", "--help"} & set(argv) and (why := extras.refusal(cmd)):
        print(why, file=sys.stderr)
        return 2
    try:
        args = build_parser(only=cmd).parse_args(argv)
        return int(args.func(args))
    except ModuleNotFoundError as exc:      # an extra this command needs is not installed
        extra = extras.extra_of(exc)
        if extra is None:
            raise
        print(extras.explain(cmd, extra, exc.name or "?"), file=sys.stderr)
        return 2
    except OSError as exc:                  # a file the command was told to read or write: said, not a traceback
        if exc.filename is None or os.environ.get("EROICA_DEBUG"):
            raise
        print(f"eroica {cmd}: {exc.filename}: {exc.strerror or exc}" + (
            " (its directory does not exist: create it first)" if isinstance(exc, FileNotFoundError)
            and not Path(exc.filename).parent.is_dir() else ""), file=sys.stderr)
        return 2


def entry() -> None:
    """The console script (the batch commands' speed tricks: eroica.cli.fastpath)."""
    from eroica.cli import fastpath

    batch = fastpath.begin(_command(sys.argv[1:]))
    try:
        rc = main()
    except BrokenPipeError:          # `eroica ... | head`: the reader has gone, nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())      # Python's flush at exit would raise again
        sys.exit(141)
    except BaseException:          # argparse's exits (--help, a usage error), an error: as raised
        fastpath.resume_collection()
        raise
    fastpath.finish(rc, batch)


if __name__ == "__main__":
    entry()
