"""The process-group layout is read from a real 3-process gloo job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CHILD = r"""
import json
import torch.distributed as dist
dist.init_process_group("gloo")
from eroica.collector.layout import process_group_layout
dp = dist.new_group([0, 1, 2], group_desc="dp")     # as large as the world: says nothing
pp = dist.new_group([1, 2], group_desc="pp")        # ranks 1 and 2 are the two stages of a pipeline
solo = [dist.new_group([r], group_desc="tp") for r in range(3)]   # size-1 groups say nothing either
print(json.dumps([g.model_dump() for g in process_group_layout()]), flush=True)
dist.destroy_process_group()
"""


def test_a_pipeline_group_gives_each_member_its_stage() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(3):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="3")
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    layouts = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert layouts == [[], [{"desc": "pp", "size": 2, "index": 0}], [{"desc": "pp", "size": 2, "index": 1}]]
