from patterns_factory import make_doc

from eroica.engine.facts import CategoryExcess, FunctionOutlier, RankSlowness
from eroica.engine.load import WindowData
from eroica.engine.peer import analyze


def window(docs):  # type: ignore[no-untyped-def]
    return WindowData("w000-s30", {d.job.rank: d for d in docs})


def slow_loader_job():  # type: ignore[no-untyped-def]
    docs = [make_doc(r, step=0.16) for r in range(4)]
    docs[2] = make_doc(2, step=0.16, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                           "data:DataLoader.__next__": 0.1})
    return docs


def test_the_culprit_is_found_and_the_victims_are_not_blamed() -> None:
    a = analyze(window(slow_loader_job()))
    slow = [f for f in a.facts if isinstance(f, RankSlowness)]
    assert [f.rank for f in slow] == [2]
    assert slow[0].least_waiting and slow[0].comm_wait_ratio_to_median < 0.5
    assert all(f.rank == 2 for f in a.facts)          # victims wait longer in comm: no fact names them
    cat = [f for f in a.facts if isinstance(f, CategoryExcess)]
    assert [(f.category, f.top_function) for f in cat] == [("data", "DataLoader.__next__")]
    assert cat[0].explains_ratio == 1.0
    fn = [f for f in a.facts if isinstance(f, FunctionOutlier)]
    assert fn and fn[0].function == "DataLoader.__next__" and fn[0].ratio_to_median > 50


def test_healthy_job_gives_no_fact(healthy_docs) -> None:  # type: ignore[no-untyped-def]
    a = analyze(window(healthy_docs))
    assert a.facts == []
    assert a.groups[0].valid


def test_small_noise_is_not_a_deviation() -> None:
    docs = [make_doc(r, busy={"compute:forward": 0.02 + 0.001 * r, "compute:backward": 0.03}) for r in range(4)]
    assert analyze(window(docs)).facts == []


def test_two_ranks_are_not_a_valid_peer_group() -> None:
    a = analyze(window(slow_loader_job()[:3][1:]))   # ranks 1 and 2
    assert not a.groups[0].valid and "too few peers" in a.groups[0].reason


def test_heterogeneous_peers_make_the_group_invalid() -> None:
    docs = [make_doc(r, busy={"compute:forward": v}) for r, v in enumerate([0.01, 0.03, 0.06, 0.09, 0.02])]
    a = analyze(window(docs))
    assert not a.groups[0].valid and "different work" in a.groups[0].reason


def test_roles_form_separate_peer_groups() -> None:
    docs = [make_doc(r, role="trainer") for r in range(4)] + [make_doc(r, role="stage1") for r in range(4, 8)]
    a = analyze(window(docs))
    assert sorted(g.name for g in a.groups) == ["stage1", "trainer"]


def test_two_culprits_at_once_are_both_found_against_the_clean_peers() -> None:
    docs = [make_doc(r, step=0.2) for r in range(4)]
    docs[1] = make_doc(1, step=0.2, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                          "data:DataLoader.__next__": 0.12})
    docs[3] = make_doc(3, step=0.2, busy={"compute:forward": 0.02, "compute:backward": 0.03,
                                          "gc:gc.collect(gen2)": 0.09})
    a = analyze(window(docs))
    slow = {f.rank: f for f in a.facts if isinstance(f, RankSlowness)}
    assert set(slow) == {1, 3}
    assert abs(slow[3].peer_median_busy_seconds_per_step - 0.051) < 1e-6   # not pulled up by rank 1
    cats = {(f.rank, f.category) for f in a.facts if isinstance(f, CategoryExcess)}
    assert {(1, "data"), (3, "gc")} <= cats


def test_an_intermittent_stall_is_found_through_its_category() -> None:
    # busy time alone is noisy across ranks; the data category on rank 1 is not
    noise = [0.045, 0.0, 0.069, 0.058]
    docs = [make_doc(r, step=0.11, busy={"compute:forward": noise[r], "data:DataLoader.__next__": 0.001})
            for r in range(4)]
    docs[1] = make_doc(1, step=0.11, busy={"compute:forward": 0.052, "data:DataLoader.__next__": 0.031})
    a = analyze(window(docs))
    assert 1 in [f.rank for f in a.facts if isinstance(f, RankSlowness)]
    assert any(isinstance(f, CategoryExcess) and f.category == "data" and f.rank == 1 for f in a.facts)
    assert not any(isinstance(f, CategoryExcess) and f.category == "data" and f.rank != 1 for f in a.facts)


def test_a_steady_capped_link_is_named_in_a_communication_bound_group() -> None:
    from patterns_factory import fn

    from eroica.engine.facts import LinkSignature
    from eroica.schema.patterns import Category

    docs = []
    for r in range(4):
        d = make_doc(r, step=0.3, busy={"compute:forward": 0.05})
        comm = fn(Category.communication, "gloo:all_reduce", 0.25, metric=3.5e7 if r == 2 else 2.0e7)
        comm = comm.model_copy(update={"metric_std": 0.2 * 3.5e7 if r == 2 else 1.6 * 2.0e7})
        hw = d.hardware.model_copy(update={"nic_bytes_per_second": {"eth0": 5e7, "lo": 0.0}})
        docs.append(d.model_copy(update={"hardware": hw, "functions": [
            f for f in d.functions if f.category != Category.communication] + [comm]}))
    links = [f for f in analyze(window(docs)).facts if isinstance(f, LinkSignature)]
    assert [(f.rank, f.steadiest) for f in links] == [(2, True)]
    assert links[0].cv_ratio_to_median < 0.2 and links[0].comm_share_ratio > 0.8
    assert 0.9 < links[0].comm_wait_ratio_to_median < 1.1          # it waits like everyone: not a late rank


def test_no_link_verdict_over_a_shared_loopback(healthy_docs) -> None:  # type: ignore[no-untyped-def]
    from eroica.engine.facts import LinkSignature

    assert not [f for f in analyze(window(healthy_docs)).facts if isinstance(f, LinkSignature)]
