"""Where a repository's validation command runs on a draft: a bubblewrap sandbox (`bwrap`), because
the draft and the repository's own tests are code nobody has reviewed yet.

Inside it: the whole system read-only; only the scratch copy writable (and a private /tmp); no
network (a network namespace of its own, with only its own loopback); a new PID namespace, so
ending the sandbox ends every process the command started; no capabilities, even when eroica runs
as root; an environment of a few variables (no model keys, no cloud credentials, no token); the
user's original checkout hidden (the command can only import the draft), and so are the usual
credential files under the home directory. A command that outlives its time is killed with all
its children (its process group, and the PID namespace's init with it).

When bwrap is missing or cannot make namespaces here, validation does not run at all: the gate
says so and how to fix it (`apt-get install bubblewrap`), or runs it unsandboxed only when the
caller asked for that in so many words (`--unsandboxed-validation`), and says that too."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROBE_SECONDS = 10.0
# credentials a test has no business reading, under the home directory of whoever runs eroica
HOME_SECRETS = (".ssh", ".aws", ".azure", ".config/gcloud", ".config/gh", ".kube", ".docker", ".gnupg", ".netrc",
                ".git-credentials", ".pypirc", ".npmrc", ".huggingface", ".cache/huggingface", ".config/openai",
                ".bash_history", ".python_history")
OUTPUT_TAIL = 3000


@dataclass(frozen=True)
class Result:
    code: int | None           # None: timed out (and killed, with every process it started)
    output: str                # the tail of stdout and stderr together
    seconds: float


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when bwrap can make its namespaces here, else why not (in words a user can act on)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        res = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
                              "--die-with-parent", "--cap-drop", "ALL", "--", "/bin/true"],
                             capture_output=True, text=True, timeout=PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if res.returncode != 0:
        return (f"bwrap cannot make namespaces here ({res.stderr.strip()[:200]}); unprivileged user namespaces "
                "may be off (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces)")
    return None


def _interpreter_trees() -> list[Path]:
    """Where the interpreter and its packages live (the venv, the base installation), outermost first."""
    trees = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    trees.add(Path(sys.executable).resolve().parent.parent)
    return sorted(trees, key=lambda p: len(p.parts))


def _hidden(repo: Path, work: Path) -> list[str]:
    """bwrap arguments that hide /tmp, the original checkout and the credential files under the home
    directory, then show the interpreter's trees again (read-only) where those covered them (a venv
    in the checkout, or a CI checkout under /tmp)."""
    args = ["--tmpfs", "/tmp"]
    covered = [Path("/tmp")]
    orig = repo.resolve()
    if not work.resolve().is_relative_to(orig):
        args += ["--tmpfs", str(orig)]
        covered.append(orig)
    home = Path.home()
    for rel in HOME_SECRETS:
        p = home / rel
        if p.is_dir() and not p.is_symlink():
            args += ["--tmpfs", str(p)]
        elif p.exists():
            args += ["--ro-bind", "/dev/null", str(p)]
    for tree in _interpreter_trees():
        if any(tree.is_relative_to(c) for c in covered):
            args += ["--ro-bind", str(tree), str(tree)]
    return args


def environment(work: Path) -> dict[str, str]:
    """The whole environment the command gets: the interpreter's bin first on PATH, the scratch copy
    (and its src/) first on PYTHONPATH, home in the scratch copy."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {"PATH": path, "HOME": str(work), "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1", "PYTHONPATH": os.pathsep.join([str(work), str(work / "src")])}


def command(argv: list[str], repo: Path, work: Path, ro_files: dict[str, Path]) -> list[str]:
    """The bwrap command line for `argv` in the scratch copy `work` of `repo`; `ro_files` (relative
    path -> original) are shown read-only in the copy (files too big to copy)."""
    bwrap = shutil.which("bwrap") or "bwrap"
    out = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += _hidden(repo, work)
    out += ["--bind", str(work), str(work)]
    for rel, src in ro_files.items():
        out += ["--ro-bind", str(src), str(work / rel)]
    out += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for k, v in environment(work).items():
        out += ["--setenv", k, v]
    return [*out, "--chdir", str(work), "--", *argv]


def run(argv: list[str], repo: Path, work: Path, timeout: float, ro_files: dict[str, Path] | None = None,
        sandboxed: bool = True) -> Result:
    """Run `argv` in `work` (in the sandbox unless `sandboxed` is False) for at most `timeout` seconds.
    Output goes to a file, not a pipe: a grandchild holding a pipe open cannot keep us waiting."""
    full = command(argv, repo, work, ro_files or {}) if sandboxed else argv
    env = None if sandboxed else {**environment(work), "PATH": os.environ.get("PATH", "")}
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            p = subprocess.Popen(full, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        except OSError as exc:
            return Result(127, str(exc), time.monotonic() - t0)
        try:
            code: int | None = p.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            code = None
        out.seek(0)
        text = out.read()[-4 * OUTPUT_TAIL:].decode(errors="replace")[-OUTPUT_TAIL:]
    return Result(code, text, time.monotonic() - t0)


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    """End the command and everything it started: its process group (bwrap and, unsandboxed, the
    command's children); in the sandbox, bwrap's death ends its PID namespace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(2.0)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        p.wait(5.0)
    except subprocess.TimeoutExpired:
        pass
