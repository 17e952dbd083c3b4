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
PACKED_FILE = re.compile(r"^(?:host|pack)-[\w.-]+\.jsonl$")     # many ranks' documents, one per line


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
        if PACKED_FILE.match(f.name):
            _load_packed(w, f)
            continue
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


def _load_packed(w: WindowData, f: Path) -> None:
    """`host-<name>.jsonl` / `pack-<name>.jsonl`: one pattern document per line (a host's ranks, or a
    whole job's), so a 100,000-rank window need not be 100,000 files."""
    try:
        fh = open(f, encoding="utf-8")
    except OSError as exc:
        w.problems.append(LoadProblem(str(f), "", f"cannot read: {exc.strerror}"))
        return
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{f}:{n}"
            try:
                raw = json.loads(line)
                schema = raw.get("schema") if isinstance(raw, dict) else None
                if schema != PATTERNS_SCHEMA:
                    raise RunDirError(f"expected {PATTERNS_SCHEMA!r}, got {schema!r}", path=where, field="schema")
                doc = PatternsDoc.model_validate(raw)
            except json.JSONDecodeError as exc:
                w.problems.append(LoadProblem(where, "", f"not valid JSON (column {exc.colno}): {exc.msg}"))
                continue
            except RunDirError as exc:
                w.problems.append(LoadProblem(where, exc.field or "", exc.message))
                continue
            except ValidationError as exc:
                for err in exc.errors()[:5]:
                    w.problems.append(LoadProblem(where, ".".join(str(x) for x in err["loc"]), err["msg"]))
                continue
            if doc.job.rank in w.docs:
                w.problems.append(LoadProblem(where, "job.rank", f"duplicate rank {doc.job.rank}; first one kept"))
                continue
            w.docs[doc.job.rank] = doc


def load_run(run_dir: Path, window: str | None = None) -> list[WindowData]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (expected RUN_DIR/<window>/rank-<R>.json)")
    dirs = sorted(d for d in run_dir.iterdir() if d.is_dir() and any(
        RANK_FILE.match(f.name) or PACKED_FILE.match(f.name) for f in d.iterdir()))
    if window is not None:
        dirs = [d for d in dirs if d.name == window]
        if not dirs:
            raise RunDirError(f"{run_dir}: no window named {window!r}")
    return [load_window(d) for d in dirs]
