import numpy as np

from eroica.engine.spikes import kept_steps, spike_facts


def steps(row: list[float], ranks: int = 4) -> np.ndarray:
    return np.array([row] * ranks)


def test_one_dominating_spike_is_left_out() -> None:
    row = [0.27] * 10
    row[3] = 9.0                       # 33x the median, longer than the other nine steps together
    keep = kept_steps(steps(row))
    assert keep.tolist() == [True] * 3 + [False] + [True] * 6


def test_a_spike_that_does_not_dominate_the_window_stays() -> None:
    # a gen-2 GC pause of 4.4x a step, once in the window: the fault itself, not a host hiccup
    row = [0.1] * 8
    row[5] = 0.44
    assert kept_steps(steps(row)).all()
    # 9x the median but shorter than the rest of the window together: stays too
    row = [0.1] * 20
    row[7] = 0.9
    assert kept_steps(steps(row)).all()


def test_recurring_spikes_are_a_pattern_and_stay() -> None:
    row = [0.1, 0.1, 5.0, 0.1, 0.1, 5.0, 0.1, 0.1, 0.1, 0.1]
    assert kept_steps(steps(row)).all()


def test_too_few_steps_keep_everything() -> None:
    assert kept_steps(steps([0.1, 0.1, 9.0, 0.1])).all()
    assert kept_steps(np.zeros((4, 0))).tolist() == []


def test_the_fact_names_the_rank_that_was_busy_through_the_spike() -> None:
    row = [0.2] * 10
    row[4] = 6.0
    step = steps(row)
    busy = np.full((4, 10), 0.05)
    busy[2, 4] = 5.9                   # rank 2 computed while ranks 0, 1, 3 waited in all_reduce
    keys = [("communication", "all_reduce"), ("compute", "fwd")]
    per = np.stack([step - busy, busy], axis=1)          # [rank, key, step]
    present = np.ones((4, 2), dtype=bool)
    keep = kept_steps(step)
    (f,) = spike_facts([0, 1, 2, 3], 30, step, busy, keys, per, present, keep)
    assert (f.rank, f.step_number, f.function, f.category) == (2, 34, "fwd", "compute")
    assert f.busy_share_ratio > 0.95 and f.peer_median_busy_seconds == 0.05
    assert f.ratio_to_median == 30.0 and f.consistency_ratio == 0.1
    assert spike_facts([0, 1, 2, 3], 30, step, busy, keys, per, present, np.ones(10, dtype=bool)) == []


def spiky_job():  # type: ignore[no-untyped-def]
    """Rank 2 computes slowly every step and waits for a CPU (runqueue 40% of each step); rank 3
    sits 5 s in D state once, at the window's step 33, while the others wait in all_reduce."""
    from patterns_factory import STEPS, make_doc

    from eroica.schema.patterns import Category

    spike = 3
    docs = []
    for r in range(4):
        d = make_doc(r, step=0.1, busy={"compute:forward": 0.07 if r == 2 else 0.04})
        steps = [5.1 if s == spike else 0.1 for s in range(STEPS)]
        funcs = []
        for f in d.functions:
            per = list(f.critical_per_step_seconds)
            if f.category == Category.communication:
                per[spike] = 5.1 - (5.05 if r == 3 else d.functions[0].critical_per_step_seconds[0])
            elif r == 3:
                per[spike] = 5.05
            funcs.append(f.model_copy(update={"critical_per_step_seconds": per}))
        rq = [0.4 if r == 2 else 0.02] * STEPS
        io = [1.0 if (r == 3 and s == spike) else 0.0 for s in range(STEPS)]
        rq[spike] = 0.0                      # everybody but rank 3 waits in the spike step
        w = [x / sum(steps) for x in steps]
        hw = d.hardware.model_copy(update={
            "runqueue_wait_ratio": sum(a * b for a, b in zip(rq, w)),
            "io_wait_ratio": sum(a * b for a, b in zip(io, w)),
            "per_step": {"runqueue_wait_ratio": rq, "io_wait_ratio": io}})
        docs.append(d.model_copy(update={
            "functions": funcs, "hardware": hw,
            "step_times": d.step_times.model_copy(update={"during_seconds": steps})}))
    return docs


def test_a_spike_neither_hides_the_sustained_culprit_nor_dilutes_its_signals() -> None:
    from eroica.engine.facts import HardwareSignal, RankSlowness, StepSpike
    from eroica.engine.load import WindowData
    from eroica.engine.peer import analyze

    docs = spiky_job()
    assert docs[2].hardware.runqueue_wait_ratio < 0.05       # the whole window hides rank 2's wait
    a = analyze(WindowData("w000-s30", {d.job.rank: d for d in docs}))
    (spike,) = [f for f in a.facts if isinstance(f, StepSpike)]
    assert (spike.rank, spike.step_number, spike.function, spike.io_wait_ratio) == (3, 33, "forward", 1.0)
    assert [f.rank for f in a.facts if isinstance(f, RankSlowness)] == [2]
    rq = next(f for f in a.facts if isinstance(f, HardwareSignal) and f.rank == 2 and f.signal == "runqueue_wait_ratio")
    assert abs(rq.value - 0.4) < 1e-6 and abs(rq.peer_median - 0.02) < 1e-6
