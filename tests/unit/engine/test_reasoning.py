"""The reasoning behind the generalization cases, unit by unit: structural peer validity, scheduled
work, absolute link evidence, the job's own history. (The recorded incidents INC-0037..INC-0042 test
them end to end.)"""

from __future__ import annotations

import numpy as np
from patterns_factory import STEPS, fn, make_doc

from eroica.engine.facts import ConfigDeviation, RankSlowness, StepSpike
from eroica.engine.history import mark_history, summarize
from eroica.engine.load import WindowData
from eroica.engine.peer import analyze
from eroica.engine.pipeline import DiagnoseOptions, diagnose
from eroica.engine.spikes import kept_steps, scheduled_steps
from eroica.engine.validity import work_dispersion
from eroica.schema.diagnosis import WindowHistory
from eroica.schema.patterns import Category, PatternsDoc


def window(docs, wid: str = "w000-s30"):  # type: ignore[no-untyped-def]
    return WindowData(wid, {d.job.rank: d for d in docs})


def with_functions(doc, extra):  # type: ignore[no-untyped-def]
    return doc.model_copy(update={"functions": [*doc.functions, *extra]})


def test_models_of_different_depth_by_design_are_no_peers_and_get_no_confident_finding() -> None:
    # rank r runs (11 + 3r) linear layers' backward nodes per step: a deeper model, by design
    docs = [with_functions(make_doc(r, busy={"compute:forward": 0.02 * (1 + r / 3)}),
                           [fn(Category.compute, "AddmmBackward0", 0.01 * (1 + r / 3), n=(11 + 3 * r) * STEPS)])
            for r in range(4)]
    a = analyze(window(docs))
    assert not a.groups[0].valid
    assert "different programs" in a.groups[0].reason and "AddmmBackward0" in a.groups[0].reason
    d = diagnose_docs(docs)
    assert all(f.confidence < 0.5 for f in d.findings), [(f.root_cause, f.confidence) for f in d.findings]


def test_a_light_windows_node_counts_show_models_of_different_depth_and_a_culprits_do_not() -> None:
    # a light window times the backward pass as one function; its node counts by type are the evidence
    def light(r: int, layers: int, work: float, counted: bool = True):  # type: ignore[no-untyped-def]
        doc = with_functions(make_doc(r, busy={"compute:forward": 0.02 * work}),
                             [fn(Category.compute, "autograd.backward", 0.01 * work, n=STEPS)])
        nodes = {"AddmmBackward0": layers * STEPS, "torch::autograd::AccumulateGrad": 8 * STEPS}
        return doc.model_copy(update={"autograd_nodes_total": nodes if counted else {}})

    deeper = analyze(window([light(r, 11 + 3 * r, 1 + r / 3) for r in range(4)]))
    assert not deeper.groups[0].valid
    assert "different programs" in deeper.groups[0].reason and "AddmmBackward0" in deeper.groups[0].reason
    culprit = analyze(window([light(r, 11, 4.0 if r == 2 else 1.0) for r in range(4)]))
    assert culprit.groups[0].valid, culprit.groups[0].reason       # the same nodes, slower: still peers
    assert [f.rank for f in culprit.facts if isinstance(f, RankSlowness)] == [2]
    partial = analyze(window([light(r, 11 + 3 * r, 1 + r / 3, counted=r != 1) for r in range(4)]))
    assert "different programs" not in partial.groups[0].reason   # a member without counts: no such claim


def test_node_counts_over_the_first_steps_of_a_window_are_per_step_counts_of_those_steps() -> None:
    # a light window stops counting once its graph is static: 3 steps' counts in a longer window
    assert STEPS > 3

    def light(r: int, layers: int, counted_steps: int | None) -> PatternsDoc:
        doc = with_functions(make_doc(r, busy={"compute:forward": 0.02}), [fn(Category.compute, "autograd.backward",
                                                                               0.01, n=STEPS)])
        k = STEPS if counted_steps is None else counted_steps
        nodes = {"AddmmBackward0": layers * k, "torch::autograd::AccumulateGrad": 8 * k}
        return doc.model_copy(update={"autograd_nodes_total": nodes, "autograd_nodes_steps": counted_steps})

    deeper = analyze(window([light(r, 11 + 3 * r, 3) for r in range(4)]))
    assert not deeper.groups[0].valid and "0: 11, 1: 14, 2: 17, 3: 20" in deeper.groups[0].reason
    # the same model on every rank, one counted on all its steps and the others on their first three
    same = analyze(window([light(r, 11, None if r == 0 else 3) for r in range(4)]))
    assert "different programs" not in same.groups[0].reason


def test_a_culprit_with_more_samples_runs_the_same_operations_and_keeps_a_valid_group() -> None:
    docs = [with_functions(make_doc(r), [fn(Category.compute, "AddmmBackward0", 0.01, n=11 * STEPS)])
            for r in range(4)]
    docs[2] = with_functions(make_doc(2, busy={"compute:forward": 0.08, "compute:backward": 0.03}),
                             [fn(Category.compute, "AddmmBackward0", 0.04, n=11 * STEPS)])
    a = analyze(window(docs))
    assert a.groups[0].valid, a.groups[0].reason
    assert [f.rank for f in a.facts if isinstance(f, RankSlowness)] == [2]


def test_work_dispersion_tells_graded_levels_from_one_culprit() -> None:
    assert work_dispersion(np.array([1.0, 1.33, 1.67, 2.0])) > 0.28          # several levels
    assert work_dispersion(np.array([1.0, 1.02, 2.5, 0.97])) < 0.1           # one rank stands out
    assert work_dispersion(np.array([1.08, 0.92, 1.22, 0.8])) < 0.28         # noise and a culprit
    assert work_dispersion(np.zeros(4)) == 0.0


def test_levels_of_work_too_small_to_make_a_suspect_are_not_different_work_by_design() -> None:
    """A capped link: the step is nearly all communication, and a few ms of compute per rank spread
    over levels (dispersion 0.33) that differ by less than a suspect's minimum excess (4% of the step):
    still peers. The same levels three times larger differ by more: different work by design."""
    def group(scale: float):  # type: ignore[no-untyped-def]
        docs = [make_doc(r, step=0.264, busy={"compute:forward": scale * ms / 1000})
                for r, ms in enumerate((6.0, 8.0, 10.0, 12.0))]
        return analyze(window(docs)).groups[0]
    small = group(1.0)                           # work 3.6..7.2 ms (CPU rate 0.6): 3.6 ms apart < 10.6 ms
    assert small.valid, small.reason
    large = group(3.0)                           # 10.8..21.6 ms: 10.8 ms apart
    assert not large.valid and "several levels" in large.reason, large.reason


def test_scheduled_work_runs_in_the_same_steps_on_every_rank() -> None:
    per_step = np.zeros((4, 3, 10))
    per_step[:, 0, :] = 0.02                     # forward: every step
    per_step[:, 1, 4] = 0.005                    # checkpoint: step 4 on every rank
    per_step[2, 1, 4] = 1.0                      # ... slow on rank 2
    per_step[1, 2, 7] = 0.3                      # a stall on one rank only: not scheduled
    keys = [("compute", "forward"), ("region", "save_checkpoint"), ("compute", "other")]
    (mask,) = scheduled_steps(per_step, keys)
    assert mask.tolist() == [i == 4 for i in range(10)]
    step = 0.05 + per_step.sum(axis=1).max(axis=0)[None, :].repeat(4, axis=0)
    assert not kept_steps(step)[4]               # alone, the spike would be left out as a one-off
    assert kept_steps(step, [mask]).all()        # a scheduled step is evidence: kept


def test_a_slow_checkpoint_in_one_step_of_ten_is_consistent_slowness_not_a_one_off() -> None:
    steps = [0.1] * 10
    steps[4] = 1.05
    docs = []
    for r in range(4):
        ckpt = [0.0] * 10
        ckpt[4] = 1.0 if r == 2 else 0.005
        work = [fn(Category.compute, "forward", 0.05), fn(Category.region, "save_checkpoint", 0.1, n=1)]
        work = [work[0].model_copy(update={"critical_per_step_seconds": [0.05] * 10, "critical_seconds": 0.5}),
                work[1].model_copy(update={"critical_per_step_seconds": ckpt, "critical_seconds": sum(ckpt)})]
        comm = [s - 0.05 - c for s, c in zip(steps, ckpt)]      # the others wait for rank 2 in step 4
        wait = fn(Category.communication, "gloo:all_reduce", 0.05, metric=3e8)
        wait = wait.model_copy(update={"critical_per_step_seconds": comm, "critical_seconds": sum(comm)})
        d = make_doc(r)
        docs.append(d.model_copy(update={
            "functions": [*work, wait], "step_times": d.step_times.model_copy(update={"during_seconds": steps})}))
    a = analyze(window(docs))
    assert not [f for f in a.facts if isinstance(f, StepSpike)]       # not a one-off: scheduled work
    (slow,) = [f for f in a.facts if isinstance(f, RankSlowness)]
    assert slow.rank == 2 and slow.consistency_ratio == 1.0           # slow in every checkpoint it wrote


def test_a_config_difference_the_rank_had_while_healthy_cannot_explain_a_later_slowdown() -> None:
    def docs(wid: str, slow: bool):  # type: ignore[no-untyped-def]
        out = []
        for r in range(4):
            busy = {"compute:forward": 0.08 if (slow and r == 3) else 0.02, "compute:backward": 0.03}
            d = make_doc(r, busy=busy, window=wid, step=0.14 if slow else 0.1)   # the job slowed since
            d = d.model_copy(update={"window": d.window.model_copy(update={"start_step": int(wid.split("-s")[1])})})
            cfg = [c for c in d.config] + [make_cfg("cpu.affinity_count", "1" if r == 3 else "2")]
            out.append(d.model_copy(update={"config": cfg}))
        return out

    early, late = window(docs("w000-s15", False), "w000-s15"), window(docs("w001-s56", True), "w001-s56")
    # the earlier window is read as its summary only: the documents are never needed again
    healthy_then = summarize(early, analyze(early), ())
    assert [(d.rank, d.key, d.value, d.peer_value) for d in healthy_then.config_deviations] == [
        (3, "cpu.affinity_count", "1", "2")]
    a = analyze(late)
    mark_history(late, a, [healthy_then])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert dev.seen_while_healthy and dev.seen_in_window == "w000-s15"
    # a summary that went through JSON (as the service stores it) says the same
    a = analyze(late)
    mark_history(late, a, [WindowHistory.model_validate_json(healthy_then.model_dump_json())])
    assert [f for f in a.facts if isinstance(f, ConfigDeviation)][0].seen_while_healthy
    # the earlier window was as slow as now: it says nothing about what began later
    same = window(docs("w000-s15", True), "w000-s15")
    a = analyze(late)
    mark_history(late, a, [summarize(same, analyze(same), ())])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert not dev.seen_while_healthy
    # a later window is not history
    a = analyze(early)
    mark_history(early, a, [summarize(late, analyze(late), ())])
    assert not any(f.seen_while_healthy for f in a.facts if isinstance(f, ConfigDeviation))
    # without the healthy window the same difference is a lead
    a = analyze(late)
    mark_history(late, a, [])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert not dev.seen_while_healthy
    # diagnosed together, each window is summarized once, and its summary carries what was found
    from eroica.engine import diagnose_documents
    from eroica.engine import history as hist

    calls = []
    real = hist.config_deviations

    def counted(w, a):  # type: ignore[no-untyped-def]
        calls.append(w.window_id)
        return real(w, a)

    hist.config_deviations = counted
    try:
        d = diagnose_documents([early, late], opts=DiagnoseOptions(in_process=True))
    finally:
        hist.config_deviations = real
    assert sorted(calls) == ["w000-s15", "w001-s56"]
    by = {w.window: w for w in d.windows}
    assert by["w001-s56"].history is not None and by["w001-s56"].history.config_deviations
    assert [(f.root_cause, f.ranks) for f in by["w001-s56"].history.findings] == [
        (c, list(r)) for c, r in sorted({(f.root_cause, tuple(f.ranks)) for f in by["w001-s56"].findings})]


def test_a_dated_difference_the_job_ran_healthy_with_is_marked_from_the_step_series_alone() -> None:
    """No earlier window: the collector dated the setting and the window's always-on step series shows
    the job at its healthy step after it began."""
    def docs(since: int, before: list[float]):  # type: ignore[no-untyped-def]
        out = []
        for r in range(4):
            busy = {"compute:forward": 0.08 if r == 3 else 0.02, "compute:backward": 0.03}
            d = make_doc(r, busy=busy, window="w001-s56", step=0.14)
            d = d.model_copy(update={
                "window": d.window.model_copy(update={"start_step": 56}),
                "step_times": d.step_times.model_copy(update={"before_seconds": before}),
                "config": [*d.config, make_cfg("cpu.affinity_count", "1" if r == 3 else "2",
                                               since if r == 3 else 0)]})
            out.append(d)
        return out

    healthy_then_slow = [0.1] * 34 + [0.14] * 20           # steps 2..35 at 0.1 s, then 0.14 s
    w = window(docs(0, healthy_then_slow), "w001-s56")
    a = analyze(w)
    mark_history(w, a, [])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert dev.seen_while_healthy and dev.since_step == 0 and dev.seen_in_window is None
    assert (dev.healthy_from_step, dev.healthy_to_step, dev.healthy_step_seconds) == (10, 21, 0.1)
    assert "from the job's start" in dev.evidence() and "steps 10-21" in dev.while_healthy()
    # the difference began with the slowdown (the collector dated it at step 36): a lead, not history
    w = window(docs(36, healthy_then_slow), "w001-s56")
    a = analyze(w)
    mark_history(w, a, [])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert not dev.seen_while_healthy and dev.since_step == 36
    # slow from the start: no healthy stretch, whatever the noise of the fastest few steps
    noisy = [0.14 * (0.8 if i % 7 == 0 else 1.0) for i in range(54)]
    w = window(docs(0, noisy), "w001-s56")
    a = analyze(w)
    mark_history(w, a, [])
    assert not [f for f in a.facts if isinstance(f, ConfigDeviation)][0].seen_while_healthy
    # an older collector did not date its settings: nothing is assumed
    undated = [d.model_copy(update={"config": [c.model_copy(update={"since_step": None}) for c in d.config]})
               for d in docs(0, healthy_then_slow)]
    w = window(undated, "w001-s56")
    a = analyze(w)
    mark_history(w, a, [])
    (dev,) = [f for f in a.facts if isinstance(f, ConfigDeviation)]
    assert not dev.seen_while_healthy and dev.since_step is None


def make_cfg(key: str, value: str, since: int | None = None):  # type: ignore[no-untyped-def]
    from eroica.schema.patterns import ConfigFact

    return ConfigFact(key=key, value=value, since_step=since)


def diagnose_docs(docs):  # type: ignore[no-untyped-def]
    import tempfile
    from pathlib import Path

    from patterns_factory import write_run

    with tempfile.TemporaryDirectory() as tmp:
        d = diagnose(write_run(Path(tmp), docs), DiagnoseOptions(in_process=True))
    return d.windows[0]
