"""A command whose extra is missing says which one to install, before it starts, and `eroica --help` marks it
(tests/install/test_wheel.py shows the same in a real venv without the extras, on Python 3.13)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from eroica.cli import extras
from eroica.cli.main import main


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name in modules else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_a_command_refuses_to_start_without_its_extra_and_names_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    without(monkeypatch, "fastapi")
    assert main(["serve", "--db", "sqlite:///nowhere.db"]) == 2
    err = capsys.readouterr().err
    assert "eroica serve needs the 'serve' extra" in err and "pip install 'eroica[serve]'" in err
    assert "no module named 'fastapi'" in err
    assert main(["policy", "show"]) == 0                      # a command of the base install runs


def test_on_python_3_13_the_engine_commands_say_to_use_an_older_python(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    without(monkeypatch, "durable")
    class Py313(tuple):  # type: ignore[type-arg]
        major, minor = 3, 13

    monkeypatch.setattr(sys, "version_info", Py313((3, 13, 0, "final", 0)))
    for cmd, extra in (("diagnose", "engine"), ("serve", "serve"), ("draft", "assistant")):
        assert main([cmd, "x"]) == 2, cmd
        err = capsys.readouterr().err
        assert "runs on Python 3.10-3.12" in err and f"pip install 'eroica[{extra}]'" in err, err
    assert extras.needs_note("diagnose") == " [needs Python 3.10-3.12 with eroica[engine]]"
    assert extras.needs_note("policy") == ""


def test_help_marks_what_this_python_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    without(monkeypatch, "libcst")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "[needs: pip install 'eroica[assistant]']" in out and "eroica[all] everything" in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("eroica ")


def test_a_missing_module_of_eroicas_own_is_not_blamed_on_an_extra() -> None:
    assert extras.extra_of(ModuleNotFoundError("x", name="durable_rules_engine")) == "engine"
    assert extras.extra_of(ModuleNotFoundError("x", name="eroica.engine.gone")) is None
