"""Every command says what each of its arguments is: `eroica CMD --help` lists no argument without a help
text, and -o is the command's output (a file for a report, a directory for a run or a library)."""

from __future__ import annotations

import argparse

from eroica.cli.main import COMMANDS, build_parser


def parsers(p: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, p)]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                out += parsers(sub, f"{path} {name}")
    return out


def test_every_argument_of_every_command_has_a_help_text() -> None:
    missing = []
    for cmd in COMMANDS:
        for path, p in parsers(build_parser(only=cmd)._subparsers._group_actions[0].choices[cmd], cmd):  # type: ignore[union-attr]
            for a in p._actions:
                if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                    continue
                if not a.help or a.help == argparse.SUPPRESS and a.option_strings[:1] != ["--json"]:
                    missing.append(f"eroica {path} {'/'.join(a.option_strings) or a.dest}")
    assert missing == []


def test_o_is_the_output_wherever_a_command_writes_one() -> None:
    for cmd in ("diagnose", "run", "demo", "record", "simulate", "draft"):
        p = build_parser(only=cmd)._subparsers._group_actions[0].choices[cmd]  # type: ignore[union-attr]
        assert any("-o" in a.option_strings for a in p._actions), cmd
