"""What the collector measures, as a catalog: every hardware signal a rank's patterns carry (its unit,
the collector source that reads it, where it is read from, its range, and the fact that states it to
the rules), and every source a collector gap can name.

The engine's signal lists (eroica.engine.signals) are taken from this catalog, the rule vocabulary
(`eroica rules vocabulary`) prints it, and `eroica rules lint` checks a rule's literals and thresholds
against it; tests/project/test_vocabulary.py checks it against the collector's own code (every signal
is a field the collector fills, every source is one it names), so it cannot drift from what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

StatedAs = Literal["hw_signal", "host_cpu", "link_signature"]


@dataclass(frozen=True)
class Signal:
    """One measured signal of one rank over a window."""

    name: str
    unit: str                       # as a person reads it: "share of the window (0-1)", "cores", "bytes/s"
    source: str                     # the collector source that reads it (its gap names the same source)
    where: str                      # what is read: a /proc or /sys file, a cgroup file (v1 and v2), NVML
    scope: str                      # CPU, cgroup, memory, disk, NIC, loader workers, NVML
    description: str
    low: float | None = 0.0         # the range its values can take (None: unbounded)
    high: float | None = None
    stated_as: StatedAs = "hw_signal"   # the fact that carries it to the rules


_SHARE = "share of the window (0-1)"
_WORKERS = "/proc/<worker pid>/stat, schedstat, io"

SIGNALS: Final[tuple[Signal, ...]] = (
    Signal("cgroup_throttled_ratio", _SHARE, "cgroup_cpu",
           "cgroup v1 cpu.stat throttled_time / v2 cpu.stat throttled_usec", "cgroup",
           "time the rank's CPU cgroup was throttled by its CFS quota", high=1.0),
    Signal("cpu_util_ratio", "on-CPU share of the training thread's wall time (1.0 = a full core)", "schedstat",
           "/proc/self/task/<tid>/schedstat (on-CPU ns)", "CPU",
           "on-CPU time of the training thread per wall second", high=1.0),
    Signal("runqueue_wait_ratio", _SHARE, "schedstat", "/proc/self/task/<tid>/schedstat (run-queue ns)", "CPU",
           "time the training thread was runnable but waited for a CPU", high=1.0),
    Signal("io_wait_ratio", _SHARE, "thread_state", "/proc/self/task/<tid>/stat (state D)", "CPU",
           "share of samples with the training thread in uninterruptible sleep (block I/O, page cache, reclaim)",
           high=1.0),
    Signal("involuntary_ctx_switches_per_second", "switches/s", "ctx_switches",
           "/proc/self/task/<tid>/status nonvoluntary_ctxt_switches", "CPU",
           "times the training thread was preempted"),
    Signal("major_faults_per_second", "faults/s", "proc_stat", "/proc/self/stat majflt", "memory",
           "page faults of the process that had to read from disk"),
    Signal("minor_faults_per_second", "faults/s", "proc_stat", "/proc/self/stat minflt", "memory",
           "page faults of the process served from memory"),
    Signal("swap_used_bytes", "bytes", "memory", "/proc/self/status VmSwap", "memory",
           "the process's memory swapped out (mean over the window)"),
    Signal("cgroup_memory_usage_ratio", "usage / limit (0-1)", "cgroup_memory",
           "cgroup v1 memory.usage_in_bytes / limit_in_bytes, v2 memory.current / memory.max", "cgroup",
           "the memory cgroup's usage against its limit (mean over the window)", high=1.0),
    Signal("cgroup_memory_limit_hits_per_second", "hits/s", "cgroup_memory",
           "cgroup v1 memory.failcnt, v2 memory.events max", "cgroup",
           "times the memory cgroup hit its limit (reclaim, then OOM)"),
    Signal("disk_write_bytes_per_second", "bytes/s", "disk_io", "/proc/self/io write_bytes", "disk",
           "bytes the process wrote to block devices"),
    Signal("disk_read_bytes_per_second", "bytes/s", "disk_io", "/proc/self/io read_bytes", "disk",
           "bytes the process read from block devices"),
    Signal("process_cpu_cores", "cores", "proc_stat", "/proc/self/stat utime + stime", "CPU",
           "CPU of all the process's threads"),
    Signal("cgroup_others_cpu_cores", "cores", "cgroup_others", "cgroup.procs of the rank's CPU cgroup, "
           "then /proc/<pid>/stat", "cgroup",
           "CPU used by the other processes of the rank's container (loader workers, anything co-located)"),
    Signal("loader_worker_busy_ratio", "share of the workers' time (0-1)", "loader_workers", _WORKERS,
           "loader workers", "time the DataLoader's worker processes were busy (not waiting for an index)",
           high=1.0),
    Signal("loader_worker_cpu_ratio", "CPU seconds per worker second", "loader_workers", _WORKERS,
           "loader workers", "CPU the loader workers used, per worker"),
    Signal("loader_worker_io_wait_ratio", "share of the workers' time (0-1)", "loader_workers", _WORKERS,
           "loader workers", "time the loader workers spent in uninterruptible sleep (block I/O)", high=1.0),
    Signal("loader_worker_runqueue_wait_ratio", "seconds per worker second", "loader_workers", _WORKERS,
           "loader workers", "time the loader workers were runnable but waited for a CPU"),
    Signal("loader_worker_major_faults_per_second", "faults/s", "loader_workers", _WORKERS, "loader workers",
           "page faults of all loader workers that read from disk"),
    Signal("loader_worker_disk_read_bytes_per_second", "bytes/s", "loader_workers", _WORKERS, "loader workers",
           "bytes all loader workers read from block devices"),
    Signal("gpu_sm_clock_mhz", "MHz", "nvml", "NVML nvmlDeviceGetClockInfo(SM)", "NVML",
           "the GPU's streaming-multiprocessor clock (mean)"),
    Signal("gpu_throttled_sample_ratio", "share of samples (0-1)", "nvml",
           "NVML nvmlDeviceGetCurrentClocksThrottleReasons", "NVML",
           "samples in which the GPU's clocks were throttled (power, thermal, slowdown)", high=1.0),
    Signal("gpu_power_w", "W", "nvml", "NVML nvmlDeviceGetPowerUsage", "NVML", "the GPU's power draw (mean)"),
    Signal("gpu_temp_c", "degrees C", "nvml", "NVML nvmlDeviceGetTemperature", "NVML",
           "the GPU's temperature (mean)", low=None),
    Signal("gpu_pcie_gen", "PCIe generation", "nvml", "NVML nvmlDeviceGetCurrPcieLinkGeneration", "NVML",
           "the GPU's current PCIe link generation"),
    Signal("gpu_pcie_width", "lanes", "nvml", "NVML nvmlDeviceGetCurrPcieLinkWidth", "NVML",
           "the GPU's current PCIe link width"),
    Signal("gpu_util_ratio", "share of time a kernel ran (0-1)", "nvml", "NVML nvmlDeviceGetUtilizationRates",
           "NVML", "the GPU's utilization (mean)", high=1.0),
    Signal("gpu_nvlink_links_active", "links", "nvlink", "NVML nvmlDeviceGetNvLinkState", "NVML",
           "the fewest NVLink links up at any sample"),
    Signal("gpu_nvlink_errors_per_second", "errors/s", "nvlink", "NVML nvmlDeviceGetNvLinkErrorCounter", "NVML",
           "NVLink replay, recovery and CRC errors"),
    Signal("gpu_xid_events_total", "events", "xid", "NVML nvmlEventSetWait (Xid events)", "NVML",
           "Xid errors the driver reported for the GPU in the window"),
    Signal("gpu_ecc_corrected_per_second", "errors/s", "nvml", "NVML nvmlDeviceGetTotalEccErrors (corrected)",
           "NVML", "corrected ECC memory errors"),
    Signal("gpu_ecc_uncorrected_total", "errors", "nvml", "NVML nvmlDeviceGetTotalEccErrors (uncorrected, "
           "volatile)", "NVML", "uncorrected ECC memory errors since the driver loaded"),
    Signal("system_cpu_util_ratio", "share of all cores (0-1)", "system_cpu", "/proc/stat", "CPU",
           "the host's busy cores, all processes", high=1.0, stated_as="host_cpu"),
    Signal("nic_bytes_per_second", "bytes/s per interface", "nic", "/proc/net/dev rx + tx (loopback included)",
           "NIC", "each interface's byte rate; during communication, the link's rate and spread",
           stated_as="link_signature"),
)

#: every source a collector gap (`CollectorGap.source`, the rules' `evidence_gap.source` and `emit.needs`)
#: can name, and what its absence means
GAP_SOURCES: Final[dict[str, str]] = {
    **{s: f"the hardware sampler's {s} source ({', '.join(x.name for x in SIGNALS if x.source == s)})"
       for s in dict.fromkeys(x.source for x in SIGNALS)},
    "hardware": "no hardware samples at all (an offline trace)",
    "sampler": "the hardware sampler thread or its helper process",
    "cgroup_quota": "the CPU cgroup's quota (cpu.cfs_quota_us, cpu.max)",
    "nic_fast": "the per-connection NIC rate during communication",
    "stack_sampler": "sampled Python stacks of the training thread (user code)",
    "torch_profiler": "PyTorch's profiler: operators, kernels, memory copies",
    "raw_trace": "the bounded raw trace kept for suspects",
    "config": "the job's configuration (torch not importable)",
    "control": "runtime control of the trigger policy",
    "gather": "gathering patterns to the leader rank",
    "policy": "the trigger policy (detector off)",
    "sink": "sending documents to eroica serve",
    "store": "the torch.distributed store that synchronizes windows",
    "window": "a window closed early or late",
    "write": "writing pattern files",
    "init": "the collector's start",
    "step": "the step hook",
    "close": "the collector's close",
    "record": "recording function executions",
    "summarize": "summarizing a window",
    "request_window": "a window requested at run time",
    "wrap_loader": "wrapping the DataLoader",
    "control.log": "the control log",
}
