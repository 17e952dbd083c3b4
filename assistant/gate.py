"""The gate every draft passes before it is written: it applies, it touches only the files the
finding is about, and it adds no secret, network call or shell-out that was not there; a config
change names keys that exist. A draft that fails is discarded with the reason."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from eroica.assistant.models import Proposal

SECRET = re.compile(r"(AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY|(api[_-]?key|secret|password|token)\s*[=:]\s*"
                    r"['\"][^'\"]{6,}|sk-[A-Za-z0-9]{20,}|ghp_[A-Za-z0-9]{20,})", re.IGNORECASE)
NETWORK = re.compile(r"\b(requests\.|urllib|http\.client|httpx|socket\.|aiohttp|urlopen|ftplib|smtplib|curl |wget )")
SHELL = re.compile(r"\b(subprocess|os\.system|os\.popen|os\.exec\w*|pty\.spawn|eval\(|exec\(|__import__\()")


def touched_files(diff: str) -> list[str]:
    out = []
    for line in diff.splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            name = line[4:].split("\t")[0].strip()
            if name != "/dev/null":
                name = name[2:] if name[:2] in ("a/", "b/") else name
                if name not in out:
                    out.append(name)
    return out


def _added_removed(diff: str) -> tuple[list[str], list[str]]:
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    return added, removed


def check_diff(diff: str, repo: Path, allowed: set[str]) -> str | None:
    """None when the diff may be written; otherwise why not."""
    if not diff.strip():
        return "the draft is an empty diff"
    files = touched_files(diff)
    if not files:
        return "the draft is not a unified diff (no file headers)"
    stray = [f for f in files if f not in allowed]
    if stray:
        return f"the draft touches files unrelated to the finding: {', '.join(stray)}"
    added, removed = _added_removed(diff)
    for name, pattern in (("a secret", SECRET), ("a network call", NETWORK), ("a shell-out", SHELL)):
        new = [a for a in added if pattern.search(a) and not any(pattern.search(r) for r in removed)]
        if new:
            return f"the draft adds {name} that was not there: {new[0].strip()[:120]!r}"
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as fh:
        fh.write(diff if diff.endswith("\n") else diff + "\n")
        patch = fh.name
    try:
        res = subprocess.run(["git", "apply", "--check", "--verbose", patch], cwd=repo, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"git apply --check could not run: {exc}"
    finally:
        Path(patch).unlink(missing_ok=True)
    if res.returncode != 0:
        return f"the diff does not apply (git apply --check): {res.stderr.strip()[:300]}"
    return None


def check_config(p: Proposal, known_keys: set[str]) -> str | None:
    if not p.config:
        return "the config change names no key"
    unknown = [c.key for c in p.config if c.key not in known_keys]
    if unknown:
        return f"the config change names keys that do not exist here: {', '.join(unknown)}"
    same = [c.key for c in p.config if c.before == c.after]
    if same:
        return f"the config change does not change {', '.join(same)}"
    return None


def check(p: Proposal, repo: Path | None, allowed: set[str], known_keys: set[str]) -> str | None:
    if p.kind == "none":
        return p.rationale or "the backend proposed no change"
    if p.kind == "config":
        return check_config(p, known_keys)
    if repo is None:
        return "a code change needs --repo to check that it applies"
    return check_diff(p.diff, repo, allowed)
