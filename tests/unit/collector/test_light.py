"""The light recorder (`op_detail="light"`): framework functions timed by Python-level wrappers, not a
profiler session, on a real (one-rank, gloo) process group with a real DDP model."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.nn.parallel import DistributedDataParallel as DDP

from eroica.collector.hooks.light import BACKWARD, SAME_STEPS, LightRecorder
from eroica.collector.summarize import WindowRecord, summarize
from eroica.collector.torch_ops import TorchOpsRecorder
from eroica.schema.patterns import Category, JobInfo, PatternsDoc


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(8, 16)
    with record_function("my_region"):
        loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    metric = loss.detach().clone()
    dist.all_reduce(metric)                       # a collective from Python, blocking
    dist.all_reduce(metric, async_op=True).wait()  # not timed: its wait is elsewhere


def test_a_ddp_step_is_recorded_under_the_profilers_names_without_a_profiler(group: None) -> None:
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ops = TorchOpsRecorder()
    assert ops.start("light") is None
    for _ in range(3):
        _train_step(model, opt)
    res = ops.stop(max_events=10_000)
    assert not torch.autograd.profiler._is_profiler_enabled           # no profiler session was opened
    names = {(x.category, x.name) for x in res.executions}
    assert (Category.compute, "my_region") in names          # outermost: DDP's forward inside it is not apart
    assert (Category.compute, BACKWARD) in names
    assert (Category.compute, "Optimizer.step#SGD.step") in names
    assert (Category.compute, "Optimizer.zero_grad#SGD.zero_grad") in names
    assert (Category.communication, "gloo:all_reduce (gradient buckets)") in names
    comm = [x for x in res.executions if x.name == "gloo:all_reduce"]
    assert len(comm) == 3 and all(x.category == Category.communication for x in comm)   # the async ones: not
    # each backward's compute ends where DDP's wait for its buckets begins
    bwd = sorted(x for x in res.executions if x.name == BACKWARD)
    tails = sorted(x for x in res.executions if x.name.endswith("(gradient buckets)"))
    assert len(bwd) == len(tails) == 3
    assert all(b.end_ns == t.start_ns and b.start_ns < b.end_ns < t.end_ns for b, t in zip(bwd, tails))
    assert res.dropped == 0 and res.gaps == []
    # each backward call's autograd nodes, by type: two Linear layers, a ReLU, the sum, 4 parameters
    assert len(res.autograd_nodes) == 3
    assert [t for t, _ in res.autograd_nodes] == [b.start_ns for b in bwd]
    counts = res.autograd_nodes[0][1]
    assert counts["AddmmBackward0"] == 2 and counts["ReluBackward0"] == 1 and counts["SumBackward0"] == 1
    assert counts["torch::autograd::AccumulateGrad"] == 4


def test_node_counts_follow_the_models_depth_and_a_shared_node_is_counted_once() -> None:
    from eroica.collector.hooks.light import count_nodes

    def depth(n: int) -> dict[str, int]:
        lin = torch.nn.Linear(8, 8)
        x = torch.randn(2, 8)
        for _ in range(n):                    # the same layer n times: one AccumulateGrad per parameter
            x = torch.relu(lin(x))
        return count_nodes(x.sum())

    assert depth(2)["AddmmBackward0"] == 2 and depth(5)["AddmmBackward0"] == 5
    assert depth(5)["torch::autograd::AccumulateGrad"] == 2
    a = torch.randn(3, requires_grad=True)
    b = a * 2
    assert count_nodes((b + b).sum()) == {"SumBackward0": 1, "AddBackward0": 1, "MulBackward0": 1,
                                          "torch::autograd::AccumulateGrad": 1}
    assert count_nodes(torch.randn(3)) == {}                        # no graph: nothing to count


def test_only_the_training_thread_is_recorded_and_removal_restores_every_original(group: None) -> None:
    originals = (torch.autograd.backward, record_function.__dict__["__enter__"], dist.all_reduce)
    rec = LightRecorder()
    rec.install()
    assert torch.autograd.backward is not originals[0] and dist.all_reduce is not originals[2]

    def elsewhere() -> None:
        w = torch.ones(3, requires_grad=True)
        with record_function("other_thread"):
            (w * 2).sum().backward()
        dist.all_reduce(torch.ones(1))

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert rec.rows == [] and rec.comm == []
    rec.remove()
    assert (torch.autograd.backward, record_function.__dict__["__enter__"], dist.all_reduce) == originals


def test_a_wrapper_someone_else_wrapped_stays_in_place_and_goes_inert() -> None:
    import torch.autograd as ag

    orig = ag.backward
    rec = LightRecorder()
    rec.install()
    ours = ag.backward

    def theirs(*a: object, **k: object) -> object:
        return ours(*a, **k)

    ag.backward = theirs
    try:
        rec.remove()
        assert ag.backward is theirs                  # their patch is intact
        w = torch.ones(2, requires_grad=True)
        (w * 3).sum().backward()                      # through our inert wrapper to torch's
        assert w.grad is not None and w.grad.tolist() == [3.0, 3.0] and rec.rows == []
    finally:
        ag.backward = orig


def test_the_users_errors_pass_through_unchanged_and_nothing_of_ours_is_raised() -> None:
    rec = LightRecorder()
    rec.install()
    try:
        w = torch.ones(2)                              # no grad: torch's own error
        with pytest.raises(RuntimeError, match="does not require grad"):
            w.sum().backward()
        with pytest.raises(ValueError, match="boom"), record_function("failing"):
            raise ValueError("boom")
    finally:
        rec.remove()
    assert [r[2] for r in rec.rows] == [BACKWARD, "failing"]


def test_the_light_windows_raw_trace_is_its_own_chrome_trace_and_bounded(tmp_path: Path) -> None:
    import json

    w = torch.ones(4, requires_grad=True)
    for cap, kept in ((1 << 20, True), (10, False)):
        ops = TorchOpsRecorder()
        assert ops.start("light") is None
        with record_function("region"):
            (w * 2).sum().backward()
        path = tmp_path / f"trace-{cap}.json"
        res = ops.stop(max_events=1000, trace_path=str(path), trace_cap=cap)
        if kept:
            events = json.loads(path.read_text())["traceEvents"]
            assert res.raw_trace_bytes == path.stat().st_size and res.gaps == []
            assert {e["name"] for e in events} == {"region"} and all(e["ph"] == "X" and e["dur"] > 0 for e in events)
        else:
            assert not path.exists() and res.raw_trace_bytes == 0
            assert [g.source for g in res.gaps] == ["raw_trace"] and "over cap" in res.gaps[0].reason


def test_a_monitor_window_with_op_detail_light_writes_the_light_functions(group: None, tmp_path: Path) -> None:
    import json

    from eroica.collector import Monitor, TriggerPolicy

    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run"
    mon = Monitor(out_dir=out, policy=TriggerPolicy(op_detail="light", threshold_min_ratio=1000.0,
                                                    sustained_min_ratio=1000.0))
    for i in range(40):
        if i == 12:
            mon.request_window()
        _train_step(model, opt)
        mon.step()
    mon.close()
    docs = [json.loads(p.read_text()) for p in out.glob("w*/rank-0.json")]
    assert len(docs) == 1
    names = {f["name"] for f in docs[0]["functions"]}
    assert {BACKWARD, "gloo:all_reduce (gradient buckets)"} <= names
    assert not any("Backward0" in n for n in names)                # no autograd nodes: no profiler session
    # ... but their counts: the first steps' backward passes (the graph is static), a whole number of
    # each per counted step
    steps = docs[0]["autograd_nodes_steps"]
    nodes = docs[0]["autograd_nodes_total"]
    assert steps == SAME_STEPS < len(docs[0]["step_times"]["during_seconds"])
    assert nodes["AddmmBackward0"] == 2 * steps and nodes["ReluBackward0"] == steps


def _window(ops: TorchOpsRecorder, steps: int, step: Callable[[int], None]) -> tuple[Any, list[int]]:
    """`steps` window steps as the Monitor runs them: a step marker at the start of each, its end a bound."""
    ops.mark_step(0)
    bounds = [time.monotonic_ns()]
    for i in range(steps):
        step(i)
        bounds.append(time.monotonic_ns())
        if i + 1 < steps:
            ops.mark_step(i + 1)
    return ops.stop(max_events=10_000), bounds


def _summary(res: Any, bounds: list[int]) -> PatternsDoc:
    rec = WindowRecord(job=JobInfo(rank=0, world_size=1, hostname="h", pid=1), window_id="w000-s0",
                       start_step=0, trigger="requested", triggered_by_rank=0, step_bounds_ns=bounds,
                       before_seconds=[], baseline_median_seconds=None, executions=res.executions, samples=None,
                       autograd_nodes=res.autograd_nodes, autograd_nodes_until_ns=res.autograd_nodes_until_ns)
    return summarize(rec, 0.0, 0.0)


def test_a_static_graph_is_counted_on_the_first_steps_alone_and_said_so(group: None) -> None:
    # counting is the light window's largest cost (~0.8 us a node, every backward call): once SAME_STEPS
    # steps in a row ran the same nodes, the graph is static and the rest of the window is not walked
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ops = TorchOpsRecorder()
    assert ops.start("light") is None
    res, bounds = _window(ops, 8, lambda i: _train_step(model, opt))
    assert len(res.autograd_nodes) == SAME_STEPS and res.autograd_nodes_until_ns > bounds[SAME_STEPS]
    doc = _summary(res, bounds)
    assert doc.autograd_nodes_steps == SAME_STEPS and len(doc.step_times.during_seconds) == 8
    assert doc.autograd_nodes_total["AddmmBackward0"] == 2 * SAME_STEPS       # per counted step: 2, whole
    # every backward call is still timed
    assert len([x for x in res.executions if x.name == BACKWARD]) == 8


def test_a_graph_that_changes_between_steps_is_counted_on_every_step(group: None) -> None:
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)

    def step(i: int) -> None:                     # dynamic depth: 1, 2, 1, 2, ... layers
        x = torch.randn(2, 8)
        for _ in range(1 + i % 2):
            x = torch.relu(lin(x))
        opt.zero_grad()
        x.sum().backward()
        opt.step()

    ops = TorchOpsRecorder()
    assert ops.start("light") is None
    res, bounds = _window(ops, 8, step)
    assert len(res.autograd_nodes) == 8 and res.autograd_nodes_until_ns == 0
    doc = _summary(res, bounds)
    assert doc.autograd_nodes_steps is None                       # every step of the window
    assert doc.autograd_nodes_total["AddmmBackward0"] == 12       # 4 x 1 + 4 x 2
