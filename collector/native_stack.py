"""The native and Python stack of a silent peer on this host, read from outside with py-spy.

A rank whose training thread holds the GIL inside C code runs no Python at all: its watchdog and
its heartbeat stop, and faulthandler's dead man's switch (eroica.collector.hang) writes its Python
frames only. The C frames, where it really waits (a `sleep` in libc, a driver call, a spin in an
extension), need a reader outside the process. A peer on the same host that waits for it in a
collective has a running watchdog: it runs `py-spy dump --native` on the silent peer once per hang
and writes `<run dir>/hang-native/rank-<R>.pyspy.txt` (a JSON header line, then py-spy's text), or,
when py-spy cannot run, the reason in the header (a gap, not a silence). The first peer to get there
writes it; the others leave it.

Privileges: py-spy reads another process's memory through ptrace (`process_vm_readv`). That is
allowed for a process of the same user when `kernel.yama.ptrace_scope` is 0 or absent, and needs
CAP_SYS_PTRACE otherwise (or in a container started without it: `--cap-add SYS_PTRACE`). The py-spy
wheel ships its binary (`py-spy` beside the interpreter).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DUMP_SECONDS = 5.0          # py-spy's own time limit per dump
MAX_BYTES = 64 * 1024       # what is kept of its output


def pyspy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump(pid: int) -> tuple[str | None, str | None]:
    """(py-spy's text, None), or (None, why it could not be read)."""
    binary = pyspy_binary()
    if binary is None:
        return None, "py-spy is not installed beside this interpreter or on PATH"
    try:
        res = subprocess.run([binary, "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                             timeout=DUMP_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer in {DUMP_SECONDS:.0f} s"
    except OSError as exc:
        return None, f"py-spy could not start: {exc}"
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"py-spy failed ({why}); it needs ptrace rights on the process (see eroica.collector.native_stack)"
    return res.stdout[:MAX_BYTES], None


def silent_peers(peers: dict[str, dict[str, Any]], limit_seconds: float) -> list[tuple[int, int]]:
    """(rank, pid) of the peers on this host whose process lives but whose heartbeat is older than
    `limit_seconds`: they run no Python."""
    out = []
    for r, p in peers.items():
        age = p.get("heartbeat_age_seconds")
        if p.get("process_alive") and p.get("pid") and isinstance(age, (int, float)) and age > limit_seconds:
            out.append((int(r), int(p["pid"])))
    return out


def write_dump(out_dir: Path, rank: int, pid: int, by_rank: int) -> bool:
    """Dump peer `rank` (process `pid`) into its file unless a peer already has; True when written."""
    path = Path(out_dir) / "hang-native" / f"rank-{rank}.pyspy.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        text, gap = dump(pid)
        head = {"schema": "eroica.hang-pyspy/v1", "rank": rank, "pid": pid, "by_rank": by_rank,
                "wall_time": time.time(), "gap": gap}
        fh.write(json.dumps(head) + "\n" + (text or ""))
    return True
