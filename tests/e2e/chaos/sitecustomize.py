"""Fault injection into eroica's collector, for the fail-open suite (tests/e2e/test_fail_open_e2e.py).

Put this folder on PYTHONPATH and set EROICA_CHAOS="RANK:FAULT,RANK:FAULT...": every Python process
of that rank (the training process and its sampler helper, which inherit RANK) patches the
collector as named below before the job starts. Only the collector is broken, never the training.
"""

from __future__ import annotations

import errno
import os
import time


def _faults() -> set[str]:
    rank = os.environ.get("RANK", "")
    out = set()
    for item in os.environ.get("EROICA_CHAOS", "").split(","):
        r, _, fault = item.partition(":")
        if fault and r.strip() == rank:
            out.add(fault.strip())
    return out


def _inject(faults: set[str]) -> None:
    from eroica.collector import proc_sources, sampler, sync
    from eroica.collector.control import ControlReader
    from eroica.collector.monitor import Monitor
    from eroica.collector.nvml import NvmlSource, ReplayNvml

    if "sampler_raise" in faults:             # one /proc source breaks mid-window (after its setup read)
        plain_parse = proc_sources.SchedStat.parse
        reads = [0]

        def broken_parse(self, text):  # type: ignore[no-untyped-def]
            reads[0] += 1
            if reads[0] > 5:
                raise OSError(errno.EIO, "injected: schedstat read error")
            return plain_parse(self, text)
        proc_sources.SchedStat.parse = broken_parse
    if "sampler_hang" in faults:              # the helper never answers `stop`
        def hang(self, timeout=2.0):  # type: ignore[no-untyped-def]
            time.sleep(3600)
        sampler.HardwareSampler.stop = hang
    if "proc_errors" in faults:               # every /proc and /sys read fails
        def denied(path: str) -> str:
            raise PermissionError(errno.EACCES, f"injected: {path}")
        proc_sources._read = denied
    if "nvml_error" in faults:                # an NVML device that errors after its setup
        class Failing(ReplayNvml):
            calls = 0

            def nvmlDeviceGetPowerUsage(self, handle):  # type: ignore[no-untyped-def]  # noqa: N802
                Failing.calls += 1
                if Failing.calls > 3:
                    raise RuntimeError("injected: NVML_ERROR_GPU_IS_LOST")
                return 500_000.0

        sample = {"gpu_sm_clock_mhz": 1980, "gpu_mem_clock_mhz": 2619, "gpu_util_ratio": 0.9, "gpu_power_w": 500,
                  "gpu_power_limit_w": 700, "gpu_temp_c": 60, "gpu_throttle_mask": 0, "gpu_pcie_gen": 5,
                  "gpu_pcie_width": 16, "gpu_mem_used_bytes": 1e10}
        sampler._nvml = lambda index=None: NvmlSource(Failing([sample]), 0)
    if "record_raise" in faults:              # recording a region or a batch fails
        def bad_record(self, ex):  # type: ignore[no-untyped-def]
            if self._win.recording:
                raise RuntimeError("injected: event buffer failure")
        Monitor._record = bad_record
    if "store_raise" in faults:               # the store answers with errors
        def unreachable(*a, **k):  # type: ignore[no-untyped-def]
            raise TimeoutError("injected: store unreachable")
        sync.WindowCoordinator.poll = unreachable
        sync.WindowCoordinator.propose = unreachable
        ControlReader.poll = unreachable
    if "store_hang" in faults:                # the store never answers
        def never(*a, **k):  # type: ignore[no-untyped-def]
            time.sleep(3600)
        sync.WindowCoordinator.poll = never
        ControlReader.poll = never
    if "slow_fs" in faults:                   # a filesystem that takes 4 s per pattern write
        import pathlib

        plain = pathlib.Path.write_text

        def slow(self, *a, **k):  # type: ignore[no-untyped-def]
            if self.name.startswith(".rank-"):
                time.sleep(4)
            return plain(self, *a, **k)
        pathlib.Path.write_text = slow
    if "dies_in_window" in faults:            # the rank's process exits inside the window
        opened = Monitor._open_window

        def open_then_die(self, plan):  # type: ignore[no-untyped-def]
            opened(self, plan)
            self._die_at = self._step + 3
        step = Monitor._on_step

        def on_step(self):  # type: ignore[no-untyped-def]
            step(self)
            if getattr(self, "_die_at", None) is not None and self._step >= self._die_at:
                print(f"[rank {os.environ.get('RANK')}] injected: exiting inside the window", flush=True)
                os._exit(17)
        Monitor._open_window = open_then_die
        Monitor._on_step = on_step


_F = _faults()
if _F:
    _inject(_F)
