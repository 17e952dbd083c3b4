"""The native and Python stack of a silent peer on this host, read from outside with py-spy.

A rank whose training thread holds the GIL inside C code runs no Python at all: its watchdog and
its heartbeat stop, and faulthandler's dead man's switch (eroica.collector.hang) writes its Python
frames only, to a file. The C frames, where it really waits (a `sleep` in libc, a driver call, a
spin in an extension), need a reader outside the process. A peer on the same host that waits for it
in a collective has a running watchdog: it runs `py-spy dump --native --json` on the silent peer once
per hang and writes a hang snapshot *for* it (`eroica.hang/v1` with `native`, `read_by_rank`,
`owns_gil`, its Python frames and its C frames) to `<run dir>/hang-native/rank-<R>.pyspy.json`, and
posts it to the service like its own, so the service localizes that rank instead of calling it
silent. When py-spy cannot run, the snapshot carries why (`native_gap`), not nothing. The first peer
to get there writes it; the others leave it.

Privileges: py-spy reads another process's memory through ptrace (`process_vm_readv`). That is
allowed for a process of the same user when `kernel.yama.ptrace_scope` is 0 or absent, and needs
CAP_SYS_PTRACE otherwise (or, in a container, `--cap-add SYS_PTRACE`). The py-spy wheel ships its
binary (`py-spy` beside the interpreter).
"""

from __future__ import annotations

import json
import linecache
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eroica.schema.hang import HANG_SCHEMA

DUMP_SECONDS = 5.0          # py-spy's own time limit per dump
MAX_FRAMES = 64


def pyspy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump(pid: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(py-spy's threads of `pid`, None), or (None, why it could not be read)."""
    binary = pyspy_binary()
    if binary is None:
        return None, "py-spy is not installed beside this interpreter or on PATH"
    try:
        res = subprocess.run([binary, "dump", "--pid", str(pid), "--native", "--json"], capture_output=True,
                             text=True, timeout=DUMP_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer in {DUMP_SECONDS:.0f} s"
    except OSError as exc:
        return None, f"py-spy could not start: {exc}"
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"py-spy failed ({why}); it needs ptrace rights on the process (eroica.collector.native_stack)"
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        return None, "py-spy's output was not JSON"
    return (threads if isinstance(threads, list) else None), None if isinstance(threads, list) else "no threads"


def main_thread(threads: list[dict[str, Any]], pid: int) -> dict[str, Any] | None:
    """The process's main thread (its OS thread id is the pid), else the first."""
    return next((t for t in threads if t.get("os_thread_id") == pid), threads[0] if threads else None)


def split_frames(thread: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(its Python frames as a snapshot's `stack`, every frame as `function (file)`), innermost first."""
    py: list[dict[str, Any]] = []
    native: list[str] = []
    for f in (thread.get("frames") or [])[:MAX_FRAMES]:
        name, file, line = str(f.get("name", "?")), str(f.get("filename", "")), int(f.get("line") or 0)
        native.append(f"{name} ({f.get('short_filename') or file}{f':{line}' if line else ''})"[:200])
        if file.endswith(".py") and line:
            py.append({"file": file, "line": line, "function": name,
                       "code": linecache.getline(file, line).strip()[:160]})
    return py, native


def silent_peers(peers: dict[str, dict[str, Any]], limit_seconds: float) -> list[tuple[int, dict[str, Any]]]:
    """(rank, its view) of the peers on this host whose process lives but whose heartbeat is older than
    `limit_seconds`: they run no Python."""
    out = []
    for r, p in peers.items():
        age = p.get("heartbeat_age_seconds")
        if p.get("process_alive") and p.get("pid") and isinstance(age, (int, float)) and age > limit_seconds:
            out.append((int(r), p))
    return out


def snapshot_for(rank: int, view: dict[str, Any], by_rank: int, world_size: int, job: str,
                 limit_seconds: float, suspect_after_seconds: float | None = None) -> dict[str, Any]:
    """The hang snapshot of silent peer `rank`, as this rank reads it (py-spy) and sees it (the store);
    `limit_seconds`: the confirmed hang's limit, `suspect_after_seconds`: the suspicion's."""
    pid = int(view["pid"])
    threads, gap = dump(pid)
    thread = main_thread(threads or [], pid)
    stack, native = split_frames(thread) if thread is not None else ([], [])
    if thread is None and gap is None:
        gap = "py-spy found no thread in the process"
    age = float(view.get("heartbeat_age_seconds") or 0.0)
    return {
        "schema": HANG_SCHEMA, "job": job, "rank": rank, "world_size": world_size, "host": view.get("host"),
        "pid": pid, "wall_time": time.time(), "last_step": int(view.get("step") or 0), "stalled_seconds": age,
        "limit_seconds": round(limit_seconds, 2), "error": None, "stack": stack,
        "state": "confirmed" if age > limit_seconds else "suspected",
        "suspect_after_seconds": round(limit_seconds if suspect_after_seconds is None else suspect_after_seconds, 2),
        "stack_gap": None if stack else (gap or "py-spy saw no Python frame of the training thread"),
        "seq": None, "last_entered": None, "last_completed": None, "nics": {}, "peers": {},
        "native": True, "read_by_rank": by_rank, "owns_gil": None if thread is None else thread.get("owns_gil"),
        "native_frames": native, "native_gap": gap,
    }


def claim(out_dir: Path | None, rank: int) -> Path | None:
    """The file of peer `rank`'s py-spy snapshot, created for this process; None when a peer already
    has it (or there is no run directory: then this rank only posts it)."""
    if out_dir is None:
        return None
    path = Path(out_dir) / "hang-native" / f"rank-{rank}.pyspy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return None
    return path
