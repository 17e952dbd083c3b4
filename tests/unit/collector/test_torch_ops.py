"""How profiler rows become function executions: outermost ops, except the optimizer wrappers a
framework runs the whole step inside (Lightning's `optimizer.step(closure)`), which keep only the
time not spent in what they contain."""

from __future__ import annotations

from eroica.collector.torch_ops import _open_wrappers, _outermost


def test_a_step_run_inside_the_optimizer_wrapper_keeps_its_own_names() -> None:
    rows = sorted([(0, 100, "Optimizer.step#SGD.step"), (5, 40, "DistributedDataParallel.forward"),
                   (10, 20, "aten::linear"), (45, 90, "AddmmBackward0"), (92, 99, "Optimizer.step#SGD.step.inner")])
    got = _outermost(_open_wrappers(rows))
    assert got == [(0, 5, "Optimizer.step#SGD.step"), (5, 40, "DistributedDataParallel.forward"),
                   (40, 45, "Optimizer.step#SGD.step"), (45, 90, "AddmmBackward0"),
                   (90, 92, "Optimizer.step#SGD.step"), (92, 99, "Optimizer.step#SGD.step.inner"),
                   (99, 100, "Optimizer.step#SGD.step")]
    assert sum(e - s for s, e, _ in got) == 100                  # every nanosecond once


def test_a_plain_optimizer_step_and_other_wrappers_are_unchanged() -> None:
    rows = [(0, 30, "DistributedDataParallel.forward"), (5, 10, "aten::mm"), (40, 50, "Optimizer.step#SGD.step")]
    assert _outermost(_open_wrappers(rows)) == [(0, 30, "DistributedDataParallel.forward"),
                                                (40, 50, "Optimizer.step#SGD.step")]


def test_the_wrappers_own_time_while_a_collective_is_in_flight_is_the_wait_for_it() -> None:
    from eroica.collector.critical import Execution
    from eroica.collector.torch_ops import _yield_to_collectives
    from eroica.schema.patterns import Category

    execs = [Execution(0, 5, Category.compute, "Optimizer.step#SGD.step"),
             Execution(5, 40, Category.compute, "DistributedDataParallel.forward"),
             Execution(40, 130, Category.compute, "Optimizer.step#SGD.step"),   # DDP waits for all_reduce
             Execution(30, 120, Category.communication, "gloo:all_reduce")]      # on gloo's thread
    got = sorted((x.start_ns, x.end_ns, x.name) for x in _yield_to_collectives(execs))
    assert got == [(0, 5, "Optimizer.step#SGD.step"), (5, 40, "DistributedDataParallel.forward"),
                   (30, 120, "gloo:all_reduce"), (120, 130, "Optimizer.step#SGD.step")]


def test_a_long_collective_that_began_first_still_covers_the_wrapper() -> None:
    from eroica.collector.torch_ops import _subtract

    assert _subtract(50, 120, [(0, 100), (10, 20)]) == [(100, 120)]
    assert _subtract(50, 120, []) == [(50, 120)]
