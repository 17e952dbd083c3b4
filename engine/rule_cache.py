"""The compiled rule base, cached between processes: parsing ~40 YAML rule files and compiling them
costs more than diagnosing a small job, and every `eroica diagnose` would pay it again.

The key is every input's path, size and modification time (rule files, overrides, priors,
taxonomies), the engine's own rule modules and eroica's version; any change is a new key. The
cache lives in `$EROICA_CACHE_DIR` or `$XDG_CACHE_HOME/eroica` (`~/.cache/eroica`); a cache that
cannot be read or written is simply not used (`EROICA_CACHE_DIR=off` turns it off)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from eroica.engine import VERSION
from eroica.engine.rules.ir import RuleIR

KEEP = 16         # newest entries kept: a site with a few knowledge directories


def cache_dir() -> Path | None:
    """Where eroica keeps what it compiled, between processes (the rule base here, the report
    templates in engine/reports.py); None: turned off."""
    env = os.environ.get("EROICA_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eroica"


def cache_key(inputs: list[Path], fitted_priors: bool) -> str:
    here = Path(__file__).parent
    # the compiler and the checks a rule base passes (the vocabulary: facts, signals, categories)
    code = [*sorted((here / "rules").glob("*.py")), *(here / n for n in ("facts.py", "signals.py", "hypotheses.py",
            "taxonomy.py")), *(here.parent / "schema" / n for n in ("signals.py", "patterns.py", "hang.py"))]
    h = hashlib.sha256(f"{VERSION}|{fitted_priors}".encode())
    for p in [*inputs, *code, Path(__file__)]:
        try:
            st = p.stat()
        except OSError:
            h.update(f"{p}|absent".encode())
            continue
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


Compiled = tuple[list[RuleIR], list[str]]     # the rules, and what the sites changed (Knowledge.notes)


def get(key: str) -> Compiled | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        with open(d / f"rules-{key}.pickle", "rb") as fh:
            rules, notes = pickle.load(fh)
        ok = (isinstance(rules, list) and all(isinstance(r, RuleIR) for r in rules)
              and isinstance(notes, list) and all(isinstance(n, str) for n in notes))
        return (rules, notes) if ok else None
    except Exception:
        return None


def put(key: str, rules: Compiled) -> None:
    d = cache_dir()
    if d is None:
        return
    with contextlib.suppress(Exception):
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".rules-", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(rules, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, d / f"rules-{key}.pickle")
        old = sorted(d.glob("rules-*.pickle"), key=lambda p: p.stat().st_mtime)[:-KEEP]
        for p in old:
            p.unlink()
