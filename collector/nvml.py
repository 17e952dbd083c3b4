"""GPU signals through NVML (`nvidia-ml-py`, imported as `pynvml`), behind the sampler's Source interface.

Every call is guarded: a field the driver does not expose is dropped from the columns at setup
(and reported as a gap by the caller); a failing read makes the whole source a gap. Without a
GPU the setup fails with a clear reason. `ReplayNvml` feeds recorded NVML-like samples through
the same module interface, for tests on machines without a GPU (clearly a replay, not NVML).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: clock-throttle (clock-event) reason bits, from nvml.h: 0x1 gpu_idle, 0x2 applications_clocks_setting,
#: 0x4 sw_power_cap, 0x8 hw_slowdown, 0x10 sync_boost, 0x20 sw_thermal_slowdown, 0x40 hw_thermal_slowdown,
#: 0x80 hw_power_brake_slowdown, 0x100 display_clock_setting. The summary keeps the window's OR of them
#: (gpu_throttle_mask) and the share of samples with any but idling set (gpu_throttled_sample_ratio).
IDLE_REASON = 0x1     # an idle GPU parks its clocks: set on every healthy GPU between kernels


def throttled(mask: int) -> bool:
    """A reason other than idling holds the clocks down (an H200 at 345 MHz between jobs sets only 0x1)."""
    return bool(mask & ~IDLE_REASON)


def gpu_index_for_rank() -> int:
    """The NVML index of this rank's GPU: LOCAL_RANK mapped through CUDA_VISIBLE_DEVICES (ranks past
    the visible devices share them in turn, as `jobinfo.device_of` names them)."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if ids and ids[local % len(ids)].isdigit():
            return int(ids[local % len(ids)])
    return local


def device_handle(nvml: Any, index: int) -> Any:
    """The NVML handle of GPU `index`, taken modulo the GPUs the driver lists: more ranks than GPUs on
    a host (two ranks sharing one GPU) read the GPU they share, never a missing index."""
    count = int(nvml.nvmlDeviceGetCount())
    return nvml.nvmlDeviceGetHandleByIndex(index % count if count > 0 else index)


@dataclass
class NvmlSource:
    """Reads one GPU. `nvml` is the pynvml module or a replay with the same functions."""

    nvml: Any
    index: int
    name: str = "nvml"
    slow: bool = False
    columns: tuple[str, ...] = ()
    unavailable: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.nvml
        n.nvmlInit()
        self.handle = device_handle(n, self.index)
        probes = {
            "gpu_sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
            "gpu_mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM),
            "gpu_util_ratio": lambda: n.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0,
            "gpu_power_w": lambda: n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
            "gpu_power_limit_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0,
            "gpu_temp_c": lambda: n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU),
            "gpu_throttle_mask": lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle),
            "gpu_pcie_gen": lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(self.handle),
            "gpu_pcie_width": lambda: n.nvmlDeviceGetCurrPcieLinkWidth(self.handle),
            "gpu_mem_used_bytes": lambda: n.nvmlDeviceGetMemoryInfo(self.handle).used,
            # the link's best: a current generation or width below it is a downgraded link
            "gpu_pcie_max_gen": lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(self.handle),
            "gpu_pcie_max_width": lambda: n.nvmlDeviceGetMaxPcieLinkWidth(self.handle),
            "gpu_pcie_tx_kbps": lambda: n.nvmlDeviceGetPcieThroughput(self.handle, n.NVML_PCIE_UTIL_TX_BYTES),
            "gpu_pcie_rx_kbps": lambda: n.nvmlDeviceGetPcieThroughput(self.handle, n.NVML_PCIE_UTIL_RX_BYTES),
            "gpu_ecc_uncorrected_total": lambda: n.nvmlDeviceGetTotalEccErrors(
                self.handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            "gpu_ecc_corrected_total": lambda: n.nvmlDeviceGetTotalEccErrors(
                self.handle, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
        }
        self._probes = {}
        for col, fn in probes.items():
            try:
                float(fn())
                self._probes[col] = fn
            except Exception as exc:  # a field this driver/GPU does not expose
                self.unavailable.append(f"{col}: {exc!r}"[:120])
        if not self._probes:
            raise RuntimeError("NVML answered no field for this GPU")
        self.columns = tuple(self._probes)

    def read(self) -> tuple[float, ...]:
        return tuple(float(fn()) for fn in self._probes.values())


@dataclass
class NvlinkSource:
    """NVLink state of one GPU: links up out of the links present, and their error counters summed
    (replays, recoveries, CRC errors: a link that errs retrains and runs slower before it fails).
    Read every few samples (`slow`): it is one NVML call per link and counter."""

    nvml: Any
    index: int
    name: str = "nvlink"
    slow: bool = True
    columns: tuple[str, ...] = ("gpu_nvlink_links_active", "gpu_nvlink_links_total", "gpu_nvlink_errors_total")
    unavailable: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.nvml
        n.nvmlInit()
        self.handle = device_handle(n, self.index)
        self.links: list[int] = []
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                n.nvmlDeviceGetNvLinkState(self.handle, link)
                self.links.append(link)
            except Exception:  # not present on this GPU
                continue
        if not self.links:
            raise RuntimeError("this GPU has no NVLink links (PCIe only)")
        self.counters: list[tuple[int, int]] = []
        for link in self.links:
            for counter in range(4):   # NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT, _CRC_DATA
                try:
                    n.nvmlDeviceGetNvLinkErrorCounter(self.handle, link, counter)
                    self.counters.append((link, counter))
                except Exception as exc:
                    if len(self.unavailable) < 1:
                        self.unavailable.append(f"gpu_nvlink_errors_total: counter {counter}: {exc!r}"[:120])

    def read(self) -> tuple[float, ...]:
        n = self.nvml
        up = sum(1 for link in self.links if n.nvmlDeviceGetNvLinkState(self.handle, link) == 1)
        errors = sum(n.nvmlDeviceGetNvLinkErrorCounter(self.handle, link, c) for link, c in self.counters)
        return float(up), float(len(self.links)), float(errors)


@dataclass
class XidSource:
    """Critical XID errors of one GPU, from NVML's event set: how many arrived since the previous
    read, and the last XID code (48 double-bit ECC, 63/64 row remapping, 79 fallen off the bus, 92
    high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP...). Polled without
    waiting, every few samples (`slow`); events from before the source was set up are discarded."""

    nvml: Any
    index: int
    name: str = "xid"
    slow: bool = True
    columns: tuple[str, ...] = ("gpu_xid_events", "gpu_xid_last")
    unavailable: list[str] = field(default_factory=list)
    max_drain: int = 64

    def __post_init__(self) -> None:
        n = self.nvml
        n.nvmlInit()
        self.handle = device_handle(n, self.index)
        self.events = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(self.handle, n.nvmlEventTypeXidCriticalError, self.events)
        self.last = 0.0
        self._drain()

    def _drain(self) -> int:
        n, got = self.nvml, 0
        for _ in range(self.max_drain):
            try:
                data = n.nvmlEventSetWait_v2(self.events, 0)
            except Exception as exc:
                if getattr(exc, "value", None) == n.NVML_ERROR_TIMEOUT:   # nothing (more) pending
                    break
                raise
            got += 1
            self.last = float(data.eventData)
        return got

    def read(self) -> tuple[float, ...]:
        return float(self._drain()), self.last


def open_xid_source(index: int | None = None) -> XidSource:
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py is not installed (pip install 'eroica[gpu]')") from exc
    return XidSource(pynvml, gpu_index_for_rank() if index is None else index)


def open_nvlink_source(index: int | None = None) -> NvlinkSource:
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py is not installed (pip install 'eroica[gpu]')") from exc
    return NvlinkSource(pynvml, gpu_index_for_rank() if index is None else index)


def open_nvml_source(index: int | None = None) -> NvmlSource:
    """The real thing: raises with a clear reason when there is no pynvml, driver or GPU."""
    try:
        import pynvml  # provided by the nvidia-ml-py distribution
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py is not installed (pip install 'eroica[gpu]')") from exc
    try:
        return NvmlSource(pynvml, gpu_index_for_rank() if index is None else index)
    except Exception as exc:
        raise RuntimeError(f"no NVIDIA GPU or driver reachable through NVML: {exc!r}"[:200]) from exc


class _Util:
    def __init__(self, gpu: float, memory: float) -> None:
        self.gpu, self.memory = gpu, memory


class _Mem:
    def __init__(self, used: float) -> None:
        self.used = used


class _Event:
    def __init__(self, xid: int) -> None:
        self.eventType, self.eventData = 0x8, xid


class ReplayNvmlError(Exception):
    """pynvml's NVMLError shape: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class ReplayNvml:
    """A REPLAY of recorded NVML samples behind pynvml's function names (no GPU involved).

    `samples` is a list of dicts with the columns of NvmlSource; each read of the SM clock
    advances to the next sample (cycling), so one sampler tick sees one recorded sample. A
    sample's `xid_events` (a list of XID codes) arrive in the event set once, when that sample is
    first reached.
    """

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_TIMEOUT = 10
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, samples: Sequence[dict[str, Any]]) -> None:
        if not samples:
            raise ValueError("a replay needs at least one recorded sample")
        self.samples = list(samples)
        self.i = -1
        self._queued_upto = -1
        self._queue: list[int] = []

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return object()

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, events: object) -> None:  # noqa: N802
        self._queued_upto = self.i        # events recorded before registration are not delivered

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> _Event:  # noqa: N802
        for k in range(self._queued_upto + 1, min(self.i + 1, len(self.samples))):   # each event once
            self._queue += list(self.samples[k].get("xid_events", []))
        self._queued_upto = max(self._queued_upto, self.i)
        if not self._queue:
            raise ReplayNvmlError(self.NVML_ERROR_TIMEOUT)
        return _Event(self._queue.pop(0))

    def _cur(self, key: str) -> Any:
        s = self.samples[max(self.i, 0) % len(self.samples)]
        if key not in s:
            raise KeyError(f"recorded sample has no {key}")
        return s[key]

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 1                          # a replay is one recorded GPU

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> float:  # noqa: N802
        if kind == self.NVML_CLOCK_SM:
            self.i += 1
            return self._cur("gpu_sm_clock_mhz")
        return self._cur("gpu_mem_clock_mhz")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:  # noqa: N802
        return _Util(self._cur("gpu_util_ratio") * 100.0, 0.0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_power_w") * 1000.0

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_power_limit_w") * 1000.0

    def nvmlDeviceGetTemperature(self, handle: int, kind: int) -> float:  # noqa: N802
        return self._cur("gpu_temp_c")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:  # noqa: N802
        return int(self._cur("gpu_throttle_mask"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_pcie_width")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:  # noqa: N802
        return _Mem(self._cur("gpu_mem_used_bytes"))

    NVML_NVLINK_MAX_LINKS = 18
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_pcie_max_gen")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> float:  # noqa: N802
        return self._cur("gpu_pcie_max_width")

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> float:  # noqa: N802
        return self._cur("gpu_pcie_tx_kbps" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "gpu_pcie_rx_kbps")

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> float:  # noqa: N802
        return self._cur("gpu_ecc_uncorrected_total" if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
                         else "gpu_ecc_corrected_total")

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        """Recorded `nvlink_states`: one 0/1 per link present (links past it are absent)."""
        states = self._cur("nvlink_states")
        if link >= len(states):
            raise ValueError(f"NVLink {link} not present in the recording")
        return int(states[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:  # noqa: N802
        """Recorded `nvlink_errors`: the summed error count of each link (counter 0 carries it)."""
        errs = self._cur("nvlink_errors")
        return int(errs[link]) if counter == 0 else 0
