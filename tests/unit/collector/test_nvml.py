"""NVML through the sampler interface: a REPLAY of recorded samples on CPU machines; real NVML on GPUs."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

from eroica.collector.nvml import NvmlSource, ReplayNvml, open_nvml_source, throttled
from eroica.collector.sampler import HardwareSampler
from eroica.collector.summarize import hardware_summary

RECORDED = [  # an H100-like GPU that drops its SM clock under a power cap half of the time
    {"gpu_sm_clock_mhz": 1980, "gpu_mem_clock_mhz": 2619, "gpu_util_ratio": 0.97, "gpu_power_w": 610,
     "gpu_power_limit_w": 700, "gpu_temp_c": 61, "gpu_throttle_mask": 0, "gpu_pcie_gen": 5, "gpu_pcie_width": 16,
     "gpu_mem_used_bytes": 6.1e10},
    {"gpu_sm_clock_mhz": 1410, "gpu_mem_clock_mhz": 2619, "gpu_util_ratio": 0.99, "gpu_power_w": 700,
     "gpu_power_limit_w": 700, "gpu_temp_c": 66, "gpu_throttle_mask": 0x4, "gpu_pcie_gen": 5, "gpu_pcie_width": 16,
     "gpu_mem_used_bytes": 6.1e10},
]


def test_only_a_reason_other_than_idling_is_throttling() -> None:
    assert throttled(0x4 | 0x40) and throttled(0x4 | 0x1)          # power cap, thermal; cap while idle
    assert not throttled(0) and not throttled(0x1)                   # parked clocks on an idle GPU


def test_replayed_samples_flow_through_the_sampler_into_the_summary() -> None:
    src = NvmlSource(ReplayNvml(RECORDED), 0)
    s = HardwareSampler([src], 0.002, capacity=100)
    s.start()
    import time

    time.sleep(0.05)
    series = s.stop()
    sm = series.columns["gpu_sm_clock_mhz"]
    assert set(np.unique(sm[np.isfinite(sm)])) == {1410.0, 1980.0}
    hw = hardware_summary(series, 0.05)
    assert 1410 < hw.gpu["gpu_sm_clock_mhz"] < 1980
    assert int(hw.gpu["gpu_throttle_mask"]) == 0x4                  # sw_power_cap in some samples
    assert 0.2 < hw.gpu["gpu_throttled_sample_ratio"] < 0.8


def test_a_field_the_driver_lacks_is_dropped_and_listed() -> None:
    partial = [{k: v for k, v in RECORDED[0].items() if k != "gpu_pcie_gen"}]
    src = NvmlSource(ReplayNvml(partial), 0)
    assert "gpu_pcie_gen" not in src.columns
    assert any(u.startswith("gpu_pcie_gen") for u in src.unavailable)


def test_without_a_gpu_the_reason_is_clear() -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="nvidia-ml-py is not installed"):
            open_nvml_source()
        return
    try:
        src = open_nvml_source()
    except RuntimeError as exc:
        assert "NVML" in str(exc)
    else:  # a real GPU: real fields arrive
        assert "gpu_sm_clock_mhz" in src.columns


@pytest.mark.gpu
def test_real_nvml_reads_sm_clock() -> None:
    src = open_nvml_source(0)
    vals = dict(zip(src.columns, src.read()))
    assert vals["gpu_sm_clock_mhz"] > 0


def test_nvlink_state_and_errors_are_replayed_into_the_summary() -> None:
    from eroica.collector.nvml import NvlinkSource

    links_up = {**RECORDED[0], "nvlink_states": [1, 1, 1, 1], "nvlink_errors": [0, 0, 0, 0]}
    one_down = {**RECORDED[1], "nvlink_states": [1, 0, 1, 1], "nvlink_errors": [0, 40, 0, 0]}
    replay = ReplayNvml([links_up, one_down])
    gpu, link = NvmlSource(replay, 0), NvlinkSource(replay, 0)
    assert link.links == [0, 1, 2, 3] and link.slow      # links past the recording are absent
    s = HardwareSampler([gpu, link], 0.002, capacity=200)
    s.start()
    import time

    time.sleep(0.08)
    hw = hardware_summary(s.stop(), 0.08)
    assert hw.gpu["gpu_nvlink_links_active"] == 3.0       # the fewest links up at any sample
    assert hw.gpu["gpu_nvlink_links_total"] == 4.0
    assert "gpu_nvlink_errors_per_second" in hw.gpu


def test_a_gpu_without_nvlink_is_a_clear_setup_failure() -> None:
    from eroica.collector.nvml import NvlinkSource

    with pytest.raises(RuntimeError, match="no NVLink"):
        NvlinkSource(ReplayNvml([{**RECORDED[0], "nvlink_states": [], "nvlink_errors": []}]), 0)


def test_pcie_best_link_throughput_and_ecc_are_read_where_exposed() -> None:
    extra = {"gpu_pcie_max_gen": 5, "gpu_pcie_max_width": 16, "gpu_pcie_tx_kbps": 1.2e6, "gpu_pcie_rx_kbps": 3.4e6,
             "gpu_ecc_uncorrected_total": 0}
    downgraded = [{**RECORDED[0], **extra, "gpu_pcie_width": 8}]
    src = NvmlSource(ReplayNvml(downgraded), 0)
    assert {"gpu_pcie_max_width", "gpu_pcie_tx_kbps", "gpu_ecc_uncorrected_total"} <= set(src.columns)
    vals = dict(zip(src.columns, src.read()))
    assert vals["gpu_pcie_width"] < vals["gpu_pcie_max_width"]          # running below the link's best
    # a driver without them: listed as unavailable, the rest still sampled
    src2 = NvmlSource(ReplayNvml(RECORDED), 0)
    assert any(u.startswith("gpu_pcie_max_gen") for u in src2.unavailable) and "gpu_sm_clock_mhz" in src2.columns


def test_xid_events_and_corrected_ecc_are_replayed_into_the_summary() -> None:
    """XID 92 (high single-bit ECC rate) arrives through NVML's event set while the corrected-ECC
    counter climbs; events recorded before the source was set up are not counted."""
    from eroica.collector.nvml import XidSource

    ecc = {"gpu_ecc_uncorrected_total": 0}
    samples = [{**RECORDED[0], **ecc, "gpu_ecc_corrected_total": 100 + 10 * k,
                "xid_events": [92] if k == 3 else []} for k in range(6)]
    samples[0]["xid_events"] = [79]                       # before registration: discarded
    replay = ReplayNvml(samples)
    gpu = NvmlSource(replay, 0)
    gpu.read()                                            # the replay now stands at sample 0
    xid = XidSource(replay, 0)
    assert xid.read() == (0.0, 0.0) and xid.slow
    s = HardwareSampler([gpu, xid], 0.002, capacity=40)   # slow sources read every 10th sample
    s.start()
    import time

    time.sleep(0.08)
    hw = hardware_summary(s.stop(), 0.08)
    assert hw.gpu["gpu_xid_events_total"] == 1.0 and hw.gpu["gpu_xid_last"] == 92.0
    assert hw.gpu["gpu_ecc_corrected_per_second"] > 0 and hw.gpu["gpu_ecc_uncorrected_total"] == 0.0


def test_an_nvml_error_other_than_a_timeout_is_raised_to_the_sampler() -> None:
    from eroica.collector.nvml import ReplayNvmlError, XidSource

    replay = ReplayNvml(RECORDED)

    def broken(events: object, timeout_ms: int) -> None:
        raise ReplayNvmlError(999)

    xid = XidSource(replay, 0)
    replay.nvmlEventSetWait_v2 = broken  # type: ignore[method-assign]
    with pytest.raises(ReplayNvmlError):
        xid.read()
    s = HardwareSampler([xid], 0.002, capacity=10)        # the sampler turns it into a gap
    s.start()
    s.stop()
    assert any(g.source == "xid" and "read failed" in g.reason for g in s.gaps)


def test_ranks_past_the_gpus_read_the_gpu_they_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from eroica.collector.nvml import gpu_index_for_rank

    assert NvmlSource(ReplayNvml(RECORDED), 3).handle == 0      # four ranks on a one-GPU host
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert gpu_index_for_rank() == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b")           # UUIDs: the local rank, modulo at open
    assert gpu_index_for_rank() == 3


H200 = json.loads((Path(__file__).parents[2] / "data" / "nvml" / "h200.json").read_text())


def _summary(samples: list[dict], seconds: float = 0.05):  # type: ignore[no-untyped-def,type-arg]
    s = HardwareSampler([NvmlSource(ReplayNvml(samples), 0)], 0.002, capacity=200)
    s.start()
    time.sleep(seconds)
    return hardware_summary(s.stop(), seconds)


def test_a_real_h200_recording_replays_through_the_live_source() -> None:
    """REPLAY of what NVML answered on an NVIDIA H200 (bench/nvml_record.py, driver 580.159.04): every
    field the source asks for is there, and the GPU parking its SM clock at 345 MHz while idle sets
    only the idle reason, which is not throttling."""
    samples = H200["samples"]
    src = NvmlSource(ReplayNvml(samples), 0)
    assert src.unavailable == [] and len(src.columns) == 16
    load = _summary([x for x in samples if x["phase"] == "load"])
    assert load.gpu["gpu_sm_clock_mhz"] == 1980 and load.gpu["gpu_util_ratio"] > 0.8
    assert load.gpu["gpu_throttled_sample_ratio"] == 0.0 and load.gpu["gpu_pcie_width"] == 16
    parked = [x for x in samples if x["gpu_sm_clock_mhz"] < 1000]
    assert parked and {x["gpu_throttle_mask"] for x in parked} <= {0, 1}
    idle = _summary(parked)
    assert idle.gpu["gpu_sm_clock_mhz"] < 400 and idle.gpu["gpu_throttled_sample_ratio"] == 0.0
    assert not throttled(1)
