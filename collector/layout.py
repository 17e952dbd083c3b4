"""The job's process-group layout as this rank sees it: which groups it is in, and where.

Read from torch.distributed when a window closes (model-parallel groups are usually created after
the Monitor). Only the description, the size and this rank's position in each group are kept, so a
100,000-rank data-parallel group costs a few bytes. Descriptions come from `group_desc`
(`dist.new_group(..., group_desc="pp")`) or DeviceMesh dimension names.
"""

from __future__ import annotations

from eroica.schema.patterns import ProcessGroupInfo

MAX_GROUPS = 16


def process_group_layout() -> list[ProcessGroupInfo]:
    """The non-world process groups of this rank; [] when torch.distributed is not initialised."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not (dist.is_available() and dist.is_initialized()):
            return []
        me = dist.get_rank()
        world = dist.get_world_size()
        out: list[ProcessGroupInfo] = []
        for pg, ranks in list(c10d._world.pg_group_ranks.items()):
            if me not in ranks or len(ranks) == world or len(ranks) < 2:
                continue
            desc = str(getattr(pg, "group_desc", "") or c10d._world.pg_names.get(pg, "") or "group")
            out.append(ProcessGroupInfo(desc=desc[:64], size=len(ranks), index=int(ranks[me])))
            if len(out) >= MAX_GROUPS:
                break
        return out
    except Exception:  # private torch internals moved: the layout is optional
        return []
