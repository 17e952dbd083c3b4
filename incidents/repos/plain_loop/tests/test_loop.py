import contextlib
import os
import socket
import time

import torch.distributed as dist

import train


class NullMonitor:
    """eroica's Monitor API, doing nothing: where eroica is not importable (a validation sandbox)."""

    def __init__(self, *_a, **_k):
        pass

    def wrap_loader(self, loader):
        return loader

    def region(self, _name):
        return contextlib.nullcontext()

    def step(self):
        pass

    def close(self):
        pass


def test_an_epoch_trains_logs_and_checkpoints(tmp_path, monkeypatch, capsys):
    """The loop itself, as one rank: a draft that breaks the step, the metrics or the checkpoint fails here."""
    monkeypatch.chdir(tmp_path)
    if train.Monitor is None:
        monkeypatch.setattr(train, "Monitor", NullMonitor)
    (tmp_path / "checkpoints").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    try:
        train.main(epochs=1)
    finally:
        deadline = time.monotonic() + 30           # a checkpoint written in the background has time to land
        while not os.path.exists(tmp_path / "checkpoints" / "step0.pt") and time.monotonic() < deadline:
            time.sleep(0.1)
        if dist.is_initialized():
            dist.destroy_process_group()
    assert os.path.exists(tmp_path / "checkpoints" / "step0.pt")
    deadline = time.monotonic() + 10               # metrics posted in the background arrive too
    while "step 15 loss" not in capsys.readouterr().out and time.monotonic() < deadline:
        time.sleep(0.1)
