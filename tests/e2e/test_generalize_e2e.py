"""End to end, the generalization cases (ways the rules failed on another job) on live 4-rank jobs
(the same scenarios are recorded in the library as INC-0037..INC-0042, where the engine's answer
before the fix is shown wrong):

- class 1+2: a checkpoint written every 12 steps through a throttled device lands once in the
  window, every rank on a link of its own: slow storage, never the network;
- class 3: a rank pinned to one CPU from the start (healthy in a first window, or no window at all
  before), then a co-located process competes for its CPU: contention, not the affinity difference;
- class 6: a small bump opens a window that finds nothing; the fault begins while the detector
  cools down: another window opens (the detector does not buy silence) and names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eroica.engine.pipeline import diagnose
from eroica.lab.launch import CPU_ROOT, launch
from eroica.lab.netns import available as netns_available

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

CGROUP_V1 = (CPU_ROOT / "cgroup.procs").exists() and os.access(CPU_ROOT, os.W_OK)
BLKIO = os.access("/sys/fs/cgroup/blkio", os.W_OK) and os.path.exists(
    "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
NETNS, NETNS_WHY = netns_available()


def job(tmp: Path, fault: str, rank: int, fault_step: int, extra: list[str], env: dict[str, str] | None = None,
        netns: bool = False, steps: int = 100):  # type: ignore[no-untyped-def]
    res = launch(tmp, fault=fault, fault_rank=rank, fault_step=fault_step, steps=steps, extra_args=extra, env=env,
                 progress=False, netns=netns)
    assert res.ok, f"job failed: {res.returncodes}\n" + "\n".join(
        f"--- rank {r}\n{t[-1500:]}" for r, t in res.logs.items())
    return diagnose(tmp)


@pytest.mark.skipif(not (BLKIO and NETNS), reason=f"needs blkio and network namespaces (root): {NETNS_WHY}")
def test_a_slow_periodic_checkpoint_is_storage_not_the_network(tmp_path: Path) -> None:
    d = job(tmp_path, "slow_storage", 2, 25, ["--ckpt-every", "12", "--ckpt-bytes", "1048576"],
            env={"EROICA_FORCE_WINDOW_AT_STEP": "40"}, netns=True, steps=60)
    (w,) = d.windows
    top = w.findings[0]
    got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in w.findings]
    assert (top.root_cause, top.ranks, top.function) == ("slow_storage", [2], "save_checkpoint"), got
    assert top.confidence >= 0.5, got
    assert not any(f.root_cause in ("nic_degraded", "transient_stall") and f.confidence >= 0.5
                   for f in w.findings), got


@pytest.mark.skipif(not CGROUP_V1, reason="needs a writable cgroup v1 cpu controller (root)")
def test_a_difference_present_while_healthy_is_not_blamed_for_a_later_contention(tmp_path: Path) -> None:
    d = job(tmp_path, "cpu_contention", 3, 45, ["--pin-rank", "3", "--stop-after-windows", "2"],
            env={"EROICA_FORCE_WINDOW_AT_STEP": "15"})
    first, second = d.windows
    assert first.start_step == 15 and first.healthy
    got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in second.findings]
    # what the engine saw, said when it is wrong: the top finding's evidence, the collectors' gaps. (A CI
    # run and a fresh clone here once named only `unknown` on rank 3 at 0.31: the busy processes inherited
    # the pinned rank's single CPU and took 0.68 of it, under the container rule's 0.7. A container's
    # service does not share a training process's affinity; spread over the host's CPUs they take about
    # 1.0 core, and the finding is cpu_contention at 0.86-0.89.)
    seen = (got, second.findings[0].evidence if second.findings else [], second.coverage.collector_gaps)
    assert (second.findings[0].root_cause, second.findings[0].ranks) == ("cpu_contention", [3]), seen
    assert not any(f.root_cause == "framework_config" and f.confidence >= 0.5 for f in second.findings), got


@pytest.mark.skipif(not CGROUP_V1, reason="needs a writable cgroup v1 cpu controller (root)")
def test_with_no_earlier_window_the_step_series_says_the_difference_was_there_while_healthy(tmp_path: Path) -> None:
    """The same job with no window before the contention: the collector dated the pinning at the job's
    start and the window's always-on step series shows the job at its healthy step with it."""
    d = job(tmp_path, "cpu_contention", 3, 45, ["--pin-rank", "3"])
    (w,) = d.windows
    assert w.start_step > 45 and w.trigger == "detector", (w.window, w.trigger)
    got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in w.findings]
    seen = (got, w.findings[0].evidence if w.findings else [], w.coverage.collector_gaps)
    assert (w.findings[0].root_cause, w.findings[0].ranks) == ("cpu_contention", [3]), seen
    assert not any(f.root_cause == "framework_config" and f.confidence >= 0.5 for f in w.findings), got
    # the difference is named on the finding, with when the job ran healthy with it
    assert any("cpu.affinity_count = 1 on rank 3" in e and "from the job's start" in e and "not what began" in e
               for e in w.findings[0].evidence), w.findings[0].evidence


def test_a_slowdown_that_starts_during_the_cooldown_opens_another_window(tmp_path: Path) -> None:
    d = job(tmp_path, "dataloader_stall", 2, 50, ["--bump-step", "28", "--stop-after-windows", "2"], steps=140)
    assert len(d.windows) == 2, [w.window for w in d.windows]
    bump, fault = d.windows
    assert bump.start_step < 50 <= fault.start_step and fault.trigger == "detector"
    got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in fault.findings]
    assert (fault.findings[0].root_cause, fault.findings[0].ranks) == ("dataloader_stall", [2]), got
    assert fault.findings[0].confidence >= 0.5, got
