"""Read a run directory: `RUN_DIR/<window>/rank-<R>.json` -> validated pattern documents per window.

A file that cannot be read or validated is reported with its path and the failing field, and
the other ranks are still diagnosed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from eroica.collector.facts import PATTERNS_SCHEMA, PatternsDoc
from eroica.engine.errors import RunDirError

RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
TRACE_FILE = re.compile(r"^rank-(\d+)\.trace\.json$")


@dataclass(frozen=True)
class LoadProblem:
    path: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.path}{where}: {self.message}"


@dataclass
class WindowData:
    window_id: str
    docs: dict[int, PatternsDoc]
    problems: list[LoadProblem] = field(default_factory=list)
    raw_traces: dict[int, str] = field(default_factory=dict)    # rank -> bounded raw trace, when kept

    @property
    def world_size(self) -> int:
        sizes = [d.job.world_size for d in self.docs.values()]
        return max(sizes) if sizes else 0


def load_doc(path: Path) -> PatternsDoc:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunDirError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}; "
                          "the file is truncated or corrupt", path=str(path)) from exc
    if not isinstance(raw, dict):
        raise RunDirError(f"expected a JSON object, got {type(raw).__name__}", path=str(path))
    schema = raw.get("schema")
    if schema != PATTERNS_SCHEMA:
        raise RunDirError(f"expected {PATTERNS_SCHEMA!r}, got {schema!r}", path=str(path), field="schema")
    return PatternsDoc.model_validate(raw)


def load_window(wdir: Path) -> WindowData:
    w = WindowData(window_id=wdir.name, docs={})
    for f in sorted(wdir.iterdir()):
        t = TRACE_FILE.match(f.name)
        if t:
            w.raw_traces[int(t.group(1))] = str(f.resolve())
        m = RANK_FILE.match(f.name)
        if not m:
            continue
        try:
            doc = load_doc(f)
        except RunDirError as exc:
            w.problems.append(LoadProblem(str(f), exc.field or "", exc.message))
            continue
        except ValidationError as exc:
            for err in exc.errors()[:5]:
                loc = ".".join(str(x) for x in err["loc"])
                w.problems.append(LoadProblem(str(f), loc, err["msg"]))
            continue
        except OSError as exc:
            w.problems.append(LoadProblem(str(f), "", f"cannot read: {exc.strerror}"))
            continue
        rank = doc.job.rank
        if int(m.group(1)) != rank:
            w.problems.append(
                LoadProblem(str(f), "job.rank", f"file name says rank {m.group(1)}, document says {rank}")
            )
        if rank in w.docs:
            w.problems.append(LoadProblem(str(f), "job.rank", f"duplicate rank {rank}; first one kept"))
            continue
        w.docs[rank] = doc
    return w


def load_run(run_dir: Path, window: str | None = None) -> list[WindowData]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected RUN_DIR/<window>/rank-<R>.json)")
    dirs = sorted(d for d in run_dir.iterdir() if d.is_dir() and any(RANK_FILE.match(f.name) for f in d.iterdir()))
    if window is not None:
        dirs = [d for d in dirs if d.name == window]
        if not dirs:
            raise RunDirError(f"{run_dir}: no window named {window!r}")
    return [load_window(d) for d in dirs]
