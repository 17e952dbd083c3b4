"""A rank's DataLoader workers, sampled through the same out-of-process helper as the rank: real
torch workers forked from this process, real /proc readings."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from eroica.collector.loader_workers import busy, is_worker
from eroica.collector.sampler_proc import SamplerClient
from eroica.collector.summarize import hardware_summary
from eroica.schema.patterns import HardwareSummary


class Rows(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


def _sleepy(items: list[torch.Tensor]) -> torch.Tensor:
    time.sleep(0.15)               # a worker waiting on a stalled storage backend
    return torch.stack(items)


def _spin(items: list[torch.Tensor]) -> torch.Tensor:
    t = time.monotonic()
    while time.monotonic() - t < 0.15:   # a worker decoding on the CPU
        pass
    return torch.stack(items)


def _sample(collate: Callable[[list[torch.Tensor]], torch.Tensor] | None, workers: int, seconds: float,
            main_pause: float = 0.0) -> HardwareSummary:
    """Sampled in a fresh interpreter: the test runner's own children (earlier tests' forks) are no loader's."""
    import json
    import subprocess
    import sys

    name = getattr(collate, "__name__", "")
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_loader_workers as t; "
            f"print(json.dumps(t._sample_here(getattr(t, {name!r}, None), {workers}, {seconds}, {main_pause})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return HardwareSummary.model_validate(json.loads(out.stdout.strip().splitlines()[-1]))


def _sample_here(collate: Callable[[list[torch.Tensor]], torch.Tensor] | None, workers: int, seconds: float,
                 main_pause: float = 0.0) -> dict[str, object]:
    loader = DataLoader(Rows(), batch_size=4, num_workers=workers, collate_fn=collate,
                        persistent_workers=bool(workers), prefetch_factor=2 if workers else None)
    it = iter(loader)
    next(it)                        # the workers are up
    client = SamplerClient(os.getpid(), threading.get_native_id())
    try:
        assert client.start(0.005, 20000)
        t = time.monotonic()
        while time.monotonic() - t < seconds:
            next(it)
            if main_pause:
                time.sleep(main_pause)
        series = client.stop()
    finally:
        client.close()
        del it
    assert series is not None
    return hardware_summary(series, seconds).model_dump()


def test_a_stalled_loader_shows_its_workers_busy_asleep_outside_the_loader() -> None:
    hw = _sample(_sleepy, 2, 1.5)
    assert hw.loader_workers_total == 2
    assert hw.loader_worker_busy_ratio is not None and hw.loader_worker_busy_ratio >= 0.7
    assert hw.loader_worker_cpu_ratio is not None and hw.loader_worker_cpu_ratio < 0.3
    top = max(hw.loader_worker_blocked_in, key=hw.loader_worker_blocked_in.__getitem__)
    assert "sleep" in top, hw.loader_worker_blocked_in


def test_a_cpu_bound_loader_is_busy_on_the_cpu() -> None:
    hw = _sample(_spin, 2, 1.5)
    assert hw.loader_worker_busy_ratio is not None and hw.loader_worker_busy_ratio >= 0.7
    assert hw.loader_worker_cpu_ratio is not None and hw.loader_worker_cpu_ratio >= 0.4


def test_a_loader_with_headroom_has_idle_workers_and_a_subprocess_is_not_a_worker() -> None:
    other = subprocess.Popen(["sleep", "30"])        # a child that runs another program
    try:
        hw = _sample(None, 2, 1.2, main_pause=0.05)
    finally:
        other.kill()
        other.wait()
    assert hw.loader_workers_total == 2
    assert hw.loader_worker_busy_ratio is not None and hw.loader_worker_busy_ratio <= 0.3
    assert hw.loader_worker_io_wait_ratio == 0.0


def test_a_rank_without_workers_has_no_worker_fields() -> None:
    hw = _sample(None, 0, 0.3)
    assert hw.loader_workers_total is None and hw.loader_worker_busy_ratio is None


@pytest.mark.parametrize(("state", "wchan", "expected"), [
    ("R", "", True), ("D", "folio_wait_bit_common", True), ("S", "hrtimer_nanosleep", True),
    ("S", "sk_wait_data", True), ("S", "poll_schedule_timeout.constprop.0", False),
    ("S", "futex_wait_queue", False), ("S", "anon_pipe_read", False), ("Z", "", False),
])
def test_busy_means_working_or_waiting_outside_the_loaders_queues(state: str, wchan: str, expected: bool) -> None:
    assert busy(state, wchan) is expected


def test_forked_and_spawned_workers_are_workers_other_programs_are_not() -> None:
    me = b"/usr/bin/python3\x00train.py\x00"
    assert is_worker(me, me)
    assert is_worker(b"/usr/bin/python3\x00-c\x00from multiprocessing.spawn import spawn_main\x00", me)
    assert not is_worker(b"sleep\x0030\x00", me)
