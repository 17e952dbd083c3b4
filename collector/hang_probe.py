"""What a hang snapshot reads of its rank (eroica.collector.hang): the last collective it entered and
completed through torch.distributed's Python API (`Collectives`, with the default group's sequence
number), the training thread's frames, the NICs' state and byte counters in this network namespace,
torch's Flight Recorder, and the process's CPU time. Each read fails open: what cannot be read is
None or empty, never an exception into the watchdog."""

from __future__ import annotations

import fcntl
import functools
import json
import linecache
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eroica.collector.sites import OURS

FR_ENV = "TORCH_FR_BUFFER_SIZE"            # torch's Flight Recorder: set before init_process_group
FR_DEFAULT = "2000"                        # entries; `eroica run` and the lab set it when the user did not
FR_TAIL = 8
MAX_FRAMES = 40
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "all_to_all_single", "all_to_all", "reduce", "gather", "scatter",
               "send", "recv", "all_gather_object", "broadcast_object_list")


class Collectives:
    """The last collective this rank entered and completed through torch.distributed's Python API,
    with the default group's sequence number (which every collective of the group advances, DDP's
    own all-reduces included)."""

    def __init__(self) -> None:
        self.entered: dict[str, Any] | None = None
        self.completed: dict[str, Any] | None = None
        self._pg: Any = None

    def seq(self) -> int | None:
        try:
            if self._pg is None:
                from torch.distributed import distributed_c10d
                self._pg = distributed_c10d._get_default_group()
            return int(self._pg._get_sequence_number_for_group())
        except Exception:
            return None

    def install(self) -> None:
        """Wrap the module-level collectives once (idempotent); a call costs two dict writes."""
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
        except Exception:
            return
        for name in COLLECTIVES:
            fn = getattr(c10d, name, None)
            if fn is None or getattr(fn, "_eroica_hang", False):
                continue
            wrapped = self._wrap(name, fn)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        me = self

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            rec = None
            try:
                t = args[0] if args else None
                shape = list(getattr(t, "shape", [])) if t is not None and hasattr(t, "shape") else None
                caller = sys._getframe(1)
                rec = {"op": name, "seq": me.seq(), "shape": shape, "dtype": str(getattr(t, "dtype", "")) or None,
                       "file": caller.f_code.co_filename, "line": caller.f_lineno, "function": caller.f_code.co_name,
                       "wall_time": time.time()}
                me.entered = rec
            except Exception:
                pass
            out = fn(*args, **kwargs)
            if rec is not None:
                me.completed = rec
            return out
        call._eroica_hang = True  # type: ignore[attr-defined]
        return call


def frames_of(frame: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        if code.co_filename.startswith(OURS):         # eroica's own wrappers are not where the rank is
            frame = frame.f_back
            continue
        out.append({"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name,
                    "code": linecache.getline(code.co_filename, frame.f_lineno).strip()[:160]})
        frame = frame.f_back
    return out                                           # innermost first


def link_state(name: str) -> str:
    """up or down, from the interface's flags in this process's network namespace (SIOCGIFFLAGS;
    /sys/class/net shows the namespace /sys was mounted in, which may not be the process's)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            raw = fcntl.ioctl(s.fileno(), 0x8913, struct.pack("256s", name[:15].encode()))
        flags = struct.unpack("H", raw[16:18])[0]
        return "up" if flags & 0x1 and flags & 0x40 else "down"      # IFF_UP and IFF_RUNNING
    except OSError:
        return "unknown"


def read_nics() -> dict[str, dict[str, Any]]:
    """Every interface's byte counters and link state (this network namespace)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
            name, _, rest = line.partition(":")
            f = rest.split()
            name = name.strip()
            state = link_state(name)
            out[name] = {"rx_bytes": int(f[0]), "tx_bytes": int(f[8]), "operstate": state}
    except (OSError, ValueError, IndexError):
        pass
    return out


def flight_recorder() -> list[dict[str, Any]] | None:
    """The last collectives torch's Flight Recorder holds for this process (gloo and NCCL alike, when
    TORCH_FR_BUFFER_SIZE was set before the process group): every collective, DDP's own included,
    with its sequence id, operation and input sizes. None when it is off or unreadable."""
    try:
        if int(os.environ.get(FR_ENV) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) <= 0:
            return None
        import torch._C._distributed_c10d as c10d
        entries = json.loads(c10d._dump_fr_trace_json(True, False)).get("entries") or []  # type: ignore[attr-defined]
        return [{"seq": e.get("collective_seq_id"), "op": str(e.get("profiling_name", "")).partition(":")[2] or
                 e.get("profiling_name"), "sizes": e.get("input_sizes"), "state": e.get("state"),
                 "pg": (e.get("process_group") or [None])[0]} for e in entries[-FR_TAIL:]]
    except Exception:
        return None


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """fn() on a thread of its own, or None when it does not answer in time (a snapshot must not
    wait on a lock inside torch)."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else None
