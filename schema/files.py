"""The names of a run directory's files, in one place: the collector writes them, the engine reads
them, the service and the CLI tell a run directory from profiler traces by them."""

from __future__ import annotations

import re
from pathlib import Path

RANK_FILE = re.compile(r"^rank-(\d+)\.json$")                  # one rank's pattern document
TRACE_FILE = re.compile(r"^rank-(\d+)\.trace\.json$")          # its bounded raw trace, when kept
PACKED_NAME = "pack-gathered.jsonl"                            # rank 0's file of a gathered window
PACKED_FILE = re.compile(r"^(?:host|pack)-[\w.-]+\.jsonl$")     # many ranks' documents, one per line


def is_pattern_file(p: Path) -> bool:
    return bool(RANK_FILE.match(p.name) or PACKED_FILE.match(p.name))


def is_run_path(p: Path) -> bool:
    """What `eroica diagnose` reads as eroica's own: a run directory (windows or hang snapshots), an
    incident directory, one window's directory, or one pattern file. A path that does not exist
    counts too, so the engine's loader names what is wrong with it."""
    if not p.exists():
        return True
    if p.is_file():
        return is_pattern_file(p)
    if (p / "patterns").is_dir() or any(p.glob("hang-s*")) or any(p.glob("hang-native/*")):
        return True
    return any(is_pattern_file(f) for f in p.iterdir() if f.is_file()) or any(
        is_pattern_file(f) for d in p.iterdir() if d.is_dir() for f in d.iterdir())
