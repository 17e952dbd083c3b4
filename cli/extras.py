"""Which extra brings what a command needs, and what to say when it is not installed.

`pip install eroica` is what runs inside a training job (the collector, `eroica run`, the sink, and the
commands that need nothing more); diagnosis, the service and the drafts come with extras. A command whose
extra is missing says which one to install, instead of a traceback."""

from __future__ import annotations

import importlib.util
import sys

#: a third-party module -> the extra that installs it
MODULE_EXTRA: dict[str, str] = {
    "durable": "engine", "durable_rules_engine": "engine", "jinja2": "engine",
    "fastapi": "serve", "starlette": "serve", "uvicorn": "serve", "sqlalchemy": "serve", "alembic": "serve",
    "prometheus_client": "serve", "psycopg": "serve", "watchdog": "serve", "httptools": "serve",
    "libcst": "assistant", "openai": "assistant", "detect_secrets": "assistant", "tomli": "assistant",
    "torch": "torch", "pynvml": "gpu",
}
#: a command -> the extras it needs beyond the base install (the others need none)
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "diagnose": ("engine",), "rules": ("engine",), "eval": ("engine",), "draft": ("assistant", "engine"),
    "serve": ("serve", "engine"), "demo": ("engine", "torch"), "record": ("engine", "torch"),
}
#: one module whose presence says an extra is installed
_PROBE = {"engine": ("durable", "jinja2"), "serve": ("fastapi", "sqlalchemy"), "assistant": ("libcst",),
          "torch": ("torch",)}
ENGINE_PYTHONS = (3, 13)     # durable-rules 2.0.28 builds on 3.13 but fails at import there


def installed(extra: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in _PROBE.get(extra, ()))


def missing(cmd: str) -> list[str]:
    """The extras `cmd` needs that this Python lacks."""
    return [e for e in COMMAND_EXTRAS.get(cmd, ()) if not installed(e)]


def refusal(cmd: str) -> str | None:
    """Why `cmd` cannot run in this Python (an extra it needs is missing, or the engine cannot import here),
    said before it starts: a service that started and then failed every window would say it too late."""
    lacks = missing(cmd)
    if not lacks:
        return None
    if "engine" in lacks and sys.version_info >= ENGINE_PYTHONS:
        return explain(cmd, "engine", _PROBE["engine"][0])
    return explain(cmd, lacks[0], next(m for m in _PROBE[lacks[0]] if importlib.util.find_spec(m) is None),
                   also=tuple(lacks[1:]))


def needs_note(cmd: str) -> str:
    """What `eroica --help` adds to a command this Python cannot run yet ("" when it can)."""
    lacks = missing(cmd)
    if not lacks:
        return ""
    if "engine" in lacks and sys.version_info >= ENGINE_PYTHONS:
        return f" [needs Python 3.10-3.12 with eroica[{','.join(lacks)}]]"
    return f" [needs: pip install 'eroica[{','.join(lacks)}]']"


def extra_of(exc: ModuleNotFoundError) -> str | None:
    """The extra that would have installed the module `exc` found missing; None for anything else
    (an error of eroica's own is raised as it is)."""
    return MODULE_EXTRA.get((exc.name or "").split(".")[0])


def explain(cmd: str, extra: str, module: str, also: tuple[str, ...] = ()) -> str:
    """What to do, in one message: the extra to install (with the others it also lacks), or the Python to use."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if extra == "engine" and sys.version_info >= ENGINE_PYTHONS:
        wanted = COMMAND_EXTRAS.get(cmd, ("engine",))[0]     # serve and assistant bring the engine
        return (f"eroica {cmd}: the engine (diagnosis and reports) runs on Python 3.10-3.12, and this is Python "
                f"{py} ({sys.executable}): durable-rules does not import on 3.13 or later. Run `eroica {cmd}` "
                f"from a Python 3.10-3.12 environment with `pip install 'eroica[{wanted}]'`; the collector's files "
                "are the same whichever Python wrote them.")
    what = {"engine": "diagnosis and reports", "serve": "the online service", "assistant": "the drafts",
            "torch": "PyTorch (CPU wheel: pip install torch==2.13.0)", "gpu": "NVML"}.get(extra, extra)
    return (f"eroica {cmd} needs the '{extra}' extra ({what}), which is not installed in this Python "
            f"({sys.executable}, Python {py}; no module named {module!r}): pip install "
            f"'eroica[{','.join((extra, *also))}]'")
