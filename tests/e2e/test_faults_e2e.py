"""End to end: real 4-rank gloo training, real faults on chosen ranks after a healthy phase, eroica's
own detector opening a synchronized window, and the diagnosis naming the root cause and the rank.

Faults that need a writable cgroup v1 CPU controller (root) are skipped with the reason elsewhere;
the launcher removes every cgroup it made, even when the job fails, and the tests check that.
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
NETNS, NETNS_WHY = netns_available()
_MEM = [ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
        if ln.split(":", 2)[1] == "memory"]
MEMCG = bool(_MEM) and os.access(f"/sys/fs/cgroup/memory{_MEM[0]}", os.W_OK)
BLKIO = os.access("/sys/fs/cgroup/blkio", os.W_OK) and os.path.exists(
    "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
NEEDS_CGROUP = pytest.mark.skipif(
    not CGROUP_V1, reason="needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu (root)")


def run_job(tmp_path: Path, fault: str, rank: str, extra: list[str] | None = None,
            env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    res = launch(tmp_path, fault=fault, fault_rank=rank, fault_step=25, steps=100, extra_args=extra, env=env,
                 progress=False)
    assert res.ok, f"job failed: {res.returncodes}\n" + "\n".join(
        f"--- rank {r}\n{t[-2000:]}" for r, t in res.logs.items())
    if CGROUP_V1:
        assert not list(CPU_ROOT.glob("eroica-job-*")), "cgroups left behind"
    import subprocess

    assert "eroica-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not list(Path("/sys/fs/cgroup/blkio").glob("eroica-io-*")), "blkio cgroups left behind"
    if MEMCG:
        assert not list(Path(f"/sys/fs/cgroup/memory{_MEM[0]}").glob("eroica-mem-*")), "memory cgroups left behind"
    return diagnose(tmp_path)


#: a fault that slows the rank's compute (more samples, less CPU) is named in a compute function:
#: the forward or backward pass or the optimizer step, whichever its excess is largest in
COMPUTE = ("forward", "Backward", "backward", "Optimizer.step", "aten::")
#: a CPU fault may also be found as the host's or the container's (no function): when it names one,
#: it is a compute function
COMPUTE_OR_NONE = (*COMPUTE, None)

CASES = [
    # (fault(s), rank(s), workload args, what the first culprit's function must contain (one of))
    ("dataloader_stall", "1", [], "DataLoader"),
    ("workload_imbalance", "3", [], COMPUTE),
    ("gc_pause", "2", [], "gc.collect"),
    pytest.param("cpu_throttled", "0", [], COMPUTE_OR_NONE, marks=NEEDS_CGROUP),
    # six busy processes in the rank's container, not three: with three, the container's fair share of
    # the two cores let them take their CPU from every rank alike once the rank idled in a collective
    # (one CI window: the job 1.18x its baseline, rank 2 no busier than its peers, the processes at 0.4
    # of a core, below the container rule's 0.5): a job-wide slowdown with no rank to name
    pytest.param("cpu_contention", "2", ["--hogs", "6"], COMPUTE_OR_NONE, marks=NEEDS_CGROUP),
    ("user_code", "3", [], "log_metrics"),
    ("framework_config", "1", [], "num_workers"),
    pytest.param("slow_storage", "1", [], "save_checkpoint", marks=pytest.mark.skipif(
        not BLKIO, reason="needs a writable cgroup v1 blkio controller (root)")),
    pytest.param("host_memory_pressure", "3", [], "DataLoader", marks=pytest.mark.skipif(
        not MEMCG, reason="needs a writable cgroup v1 memory controller (root)")),
    pytest.param("nic_degraded", "2", [], "all_reduce", marks=pytest.mark.skipif(
        not NETNS, reason=f"needs network namespaces, veth and tc (root): {NETNS_WHY}")),
    # harder variants: intermittent, and a smaller slowdown
    ("dataloader_stall", "2", ["--every", "3"], "DataLoader"),
    ("gc_pause", "1", ["--gc-objects", "20000"], "gc.collect"),
    # faults that live in the loader's worker processes
    pytest.param("slow_storage", "2", ["--loader-workers", "2", "--storage-fault", "reads", "--read-kb", "256"],
                 "DataLoader", marks=pytest.mark.skipif(
                     not BLKIO, reason="needs a writable cgroup v1 blkio controller (root)")),
    # two culprits at once, different causes
    ("dataloader_stall,gc_pause", "1,3", [], "DataLoader"),
]


@pytest.mark.parametrize(("fault", "rank", "extra", "function_hint"), CASES,
                         ids=[f"{v[0]}@{v[1]}{''.join(v[2])}" for v in (getattr(c, "values", c) for c in CASES)])
def test_fault_is_found_named_and_explained(tmp_path: Path, fault: str, rank: str, extra: list[str],
                                            function_hint: str | tuple[str | None, ...]) -> None:
    d = run_job(tmp_path, fault, rank, extra)
    assert len(d.windows) == 1
    w = d.windows[0]
    assert w.trigger == "detector"                        # the detector fired by itself
    assert w.start_step > 25                              # after the fault began
    assert w.coverage.ranks_reported == [0, 1, 2, 3]
    expected = list(zip(fault.split(","), (int(r) for r in rank.split(","))))
    got = [(f.root_cause, f.ranks, round(f.confidence, 2)) for f in w.findings]
    confident = [f for f in w.findings if f.confidence >= 0.5]
    for cause, r in expected:
        assert any(f.root_cause == cause and f.ranks == [r] for f in confident), got
    if len(expected) == 1:
        top = w.findings[0]
        assert (top.root_cause, top.ranks) == (expected[0][0], [expected[0][1]]), got
        hints = (function_hint,) if isinstance(function_hint, str) else function_hint
        named = top.function is not None and any(h is not None and h in top.function for h in hints)
        assert named or (top.function is None and None in hints), (top.function, hints)
    culprits = {r for _, r in expected}
    victims = {r for f in confident for r in f.ranks} - culprits
    assert not victims, f"ranks that only waited were blamed: {victims}; {got}"
    # the suspects and one healthy peer keep their raw trace (elected in the job): at most 3 of the 4,
    # the busy culprits among them (a capped link makes no rank busier: its culprit is not elected)
    kept = {int(r) for r in w.raw_traces}
    assert 1 <= len(kept) <= 3 and kept < {0, 1, 2, 3}, w.raw_traces
    # (of two culprits among four ranks, the election's robust statistics single out one for sure)
    if "nic_degraded" not in fault:
        assert culprits <= kept if len(culprits) == 1 else culprits & kept, (culprits, w.raw_traces)


def test_healthy_run_gives_no_confident_finding(tmp_path: Path) -> None:
    d = run_job(tmp_path, "none", "0", env={"EROICA_FORCE_WINDOW_AT_STEP": "30"})
    assert len(d.windows) == 1 and d.windows[0].trigger == "forced"
    assert not [f for f in d.windows[0].findings if f.confidence >= 0.5]
