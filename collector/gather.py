"""Getting the patterns to one place without a shared filesystem: at a window's close every rank
sends its document (kilobytes) to a leader over a separate gloo process group of the job's own
torch.distributed (so NCCL streams are untouched): rank 0 for the whole job
(`<window>/pack-gathered.jsonl`) or, at scale, the lowest rank of each host
(`<window>/host-<name>.jsonl`, and one upload per host to the service: a batch of its ranks).
Any failure (a rank gone, a timeout) becomes a gap and the rank falls back to its own file and
upload."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
from typing import Any

from eroica.schema.files import PACKED_NAME

ENV = "EROICA_GATHER"
TIMEOUT_SECONDS = 60
HOST_SCOPE_MIN_WORLD = 64     # with a sink, jobs this wide gather per host unless told otherwise


def gather_requested(flag: bool | str | None) -> bool:
    return scope_of(flag) is not None


def scope_of(flag: bool | str | None, world_size: int = 0, sink: bool = False) -> str | None:
    """Where a window's documents are gathered: "job" (all to rank 0, one file), "host" (each host's
    ranks to its lowest rank: one file and one upload per host), or None (each rank its own).
    `flag` (Monitor(gather=...)) wins over EROICA_GATHER (1/job, host, 0); with neither, a job that
    sends to a service and has HOST_SCOPE_MIN_WORLD ranks or more gathers per host."""
    raw = flag if flag is not None else os.environ.get(ENV)
    if raw is None or raw == "":
        return "host" if sink and world_size >= HOST_SCOPE_MIN_WORLD else None
    text = str(raw).strip().lower()
    if text in ("0", "false", "no", "off", "none"):
        return None
    return "host" if text == "host" else "job"


def host_file(hostname: str) -> str:
    """A host's packed file in a window's directory (schema.files PACKED_FILE)."""
    return f"host-{re.sub(r'[^A-Za-z0-9_.-]', '_', hostname)[:200] or 'unnamed'}.jsonl"


class PatternGather:
    """Created on every rank at the same point (a collective); `send` is called by every rank at
    each window's close, with its document's JSON text or None when it has none. `scope` "job":
    to rank 0; "host": to the lowest rank of each host (the hosts are learned here, once)."""

    def __init__(self, timeout_seconds: float = TIMEOUT_SECONDS, scope: str = "job") -> None:
        import torch.distributed as dist

        self.dist = dist
        self.scope = scope
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        timeout = datetime.timedelta(seconds=timeout_seconds)
        self.group: Any = dist.new_group(backend="gloo", timeout=timeout)
        self.leader, self.members = 0, self.world
        self.hostname = socket.gethostname()
        if scope == "host":
            names: list[Any] = [None] * self.world
            dist.all_gather_object(names, self.hostname, group=self.group)
            mine = [r for r, h in enumerate(names) if h == self.hostname]
            whole, self.group = self.group, None
            with contextlib.suppress(Exception):
                dist.destroy_process_group(whole)
            # only this host's ranks take part in making its group (none waits on 10,000 other hosts)
            self.group = dist.new_group(ranks=mine, backend="gloo", timeout=timeout, use_local_synchronization=True)
            self.leader, self.members = mine[0], len(mine)

    @property
    def packed_name(self) -> str:
        return host_file(self.hostname) if self.scope == "host" else PACKED_NAME

    def send(self, text: str | None) -> str | None:
        """Gather to the leader; on the leader the packed file's text (one document per line), else None."""
        lead = self.rank == self.leader
        out: list[str | None] | None = [None] * self.members if lead else None
        self.dist.gather_object(text, out, dst=self.leader, group=self.group)
        if not lead or out is None:
            return None
        return "".join(t + "\n" for t in out if t)
    def close(self) -> None:
        """Release the group's connections (local: no other rank takes part)."""
        group, self.group = self.group, None
        if group is not None:
            try:
                self.dist.destroy_process_group(group)
            except Exception:
                pass
