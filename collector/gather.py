"""Getting the patterns to one place without a shared filesystem: at a window's close every rank
sends its document (kilobytes) to rank 0 over a separate gloo process group of the job's own
torch.distributed (so NCCL streams are untouched), and rank 0 writes them (through the Monitor's
pattern writer) as one packed file `<window>/pack-gathered.jsonl`. Any failure (a rank gone, a
timeout) becomes a gap and the rank falls back to writing its own file."""

from __future__ import annotations

import datetime
import os
from typing import Any

ENV = "EROICA_GATHER"
TIMEOUT_SECONDS = 60
PACKED_NAME = "pack-gathered.jsonl"


def wanted(flag: bool | None) -> bool:
    return bool(flag) if flag is not None else os.environ.get(ENV, "") not in ("", "0", "false", "no")


class PatternGather:
    """Created on every rank at the same point (a collective); `send` is called by every rank at
    each window's close, with its document's JSON text or None when it has none."""

    def __init__(self, timeout_seconds: float = TIMEOUT_SECONDS) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.group: Any = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_seconds))

    def send(self, text: str | None) -> str | None:
        """Gather to rank 0; on rank 0 the packed file's text (one document per line), else None."""
        out: list[str | None] | None = [None] * self.world if self.rank == 0 else None
        self.dist.gather_object(text, out, dst=0, group=self.group)
        if self.rank != 0 or out is None:
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
