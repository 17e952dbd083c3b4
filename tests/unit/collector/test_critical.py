import numpy as np

from eroica.collector.critical import Execution, attribute, metric_by_key, per_step_critical
from eroica.schema.patterns import Category as C


def keyed(seg):  # type: ignore[no-untyped-def]
    return [(int(a), int(b), seg.names[k][1]) for a, b, k in zip(seg.start_ns, seg.end_ns, seg.key)]


def test_priority_data_over_compute_over_communication_over_region() -> None:
    ex = [
        Execution(0, 100, C.compute, "fwd"),
        Execution(50, 300, C.communication, "allreduce"),   # on another thread; waited on after fwd
        Execution(120, 150, C.data, "load"),
        Execution(400, 450, C.region, "user"),
        Execution(410, 420, C.compute, "op"),
    ]
    seg = attribute(ex, 0, 500)
    assert keyed(seg) == [
        (0, 100, "fwd"), (100, 120, "allreduce"), (120, 150, "load"), (150, 300, "allreduce"),
        (300, 400, "untracked"), (400, 410, "user"), (410, 420, "op"), (420, 450, "user"), (450, 500, "untracked"),
    ]


def test_segments_tile_the_window_exactly() -> None:
    rng = np.random.default_rng(0)
    ex = []
    for i in range(300):
        s = int(rng.integers(0, 10_000))
        ex.append(Execution(s, s + int(rng.integers(1, 500)), list(C)[i % 8], f"f{i % 17}"))
    seg = attribute(ex, 1000, 9000)
    assert seg.start_ns[0] == 1000 and seg.end_ns[-1] == 9000
    assert np.all(seg.start_ns[1:] == seg.end_ns[:-1])
    assert (seg.end_ns - seg.start_ns).sum() == 8000


def test_executions_outside_the_window_are_clipped() -> None:
    seg = attribute([Execution(-50, 50, C.compute, "a"), Execution(90, 200, C.compute, "b")], 0, 100)
    assert keyed(seg) == [(0, 50, "a"), (50, 90, "untracked"), (90, 100, "b")]


def test_per_step_split() -> None:
    seg = attribute([Execution(0, 150, C.compute, "a")], 0, 200)
    m = per_step_critical(seg, [0, 100, 200])
    a = seg.names.index((C.compute, "a"))
    assert list(m[a] * 1e9) == [100, 50]
    assert list(m[0] * 1e9) == [0, 50]


def test_metric_is_overlap_weighted_per_key() -> None:
    seg = attribute([Execution(0, 100, C.data, "load"), Execution(100, 200, C.compute, "fwd")], 0, 200)
    t = np.array([0, 50, 100, 150, 200])
    rate = np.array([0.0, 0.0, 1.0, 0.8])
    mean, std, cnt = metric_by_key(seg, t, rate)
    load = seg.names.index((C.data, "load"))
    fwd = seg.names.index((C.compute, "fwd"))
    assert mean[load] == 0.0 and cnt[load] == 2
    assert abs(mean[fwd] - 0.9) < 1e-9 and abs(std[fwd] - 0.1) < 1e-9


def test_on_a_gpu_rank_device_work_holds_the_critical_path_and_host_work_fills_its_idle_gaps() -> None:
    from eroica.collector.critical import device_first
    from eroica.schema.patterns import Category

    dev = [Execution(0, 40, Category.kernel, "gemm"), Execution(40, 70, Category.communication, "ncclKernel")]
    host = [Execution(10, 90, Category.compute, "aten::launch_ahead"),     # runs ahead while the device works
            Execution(95, 100, Category.data, "DataLoader.__next__")]
    out = device_first(dev, host)
    got = sorted((e.start_ns, e.end_ns, e.name) for e in out)
    assert got == [(0, 40, "gemm"), (40, 70, "ncclKernel"), (70, 90, "aten::launch_ahead"),
                   (95, 100, "DataLoader.__next__")]
    assert device_first([], host) == host                                  # CPU-only ranks: unchanged
