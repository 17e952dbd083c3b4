from patterns_factory import make_doc

from eroica.engine.columns import window_columns
from eroica.engine.groups import peer_groups
from eroica.engine.load import WindowData
from eroica.engine.peer import analyze
from eroica.schema.patterns import ProcessGroupInfo


def with_groups(doc, groups):  # type: ignore[no-untyped-def]
    return doc.model_copy(update={"job": doc.job.model_copy(update={"process_groups": groups})})


def test_pipeline_stages_from_the_process_group_layout_are_separate_peer_groups() -> None:
    # 8 ranks, PP=2 x DP=4: stage = position in the "pp" group; the "dp" group says nothing of the work
    docs = {r: with_groups(make_doc(r, world=8), [ProcessGroupInfo(desc="pp", size=2, index=r // 4),
                                                  ProcessGroupInfo(desc="dp", size=4, index=r % 4)])
            for r in range(8)}
    g = peer_groups(window_columns(docs.values()))
    assert [(x.name, x.ranks, x.how) for x in g] == [("worker/pp0", [0, 1, 2, 3], "process-group layout"),
                                                      ("worker/pp1", [4, 5, 6, 7], "process-group layout")]
    # DeviceMesh-style names are recognised too
    mesh = {r: with_groups(make_doc(r), [ProcessGroupInfo(desc="mesh_expert", size=2, index=r % 2)]) for r in range(4)}
    assert [x.ranks for x in peer_groups(window_columns(mesh.values()))] == [[0, 2], [1, 3]]


def test_without_roles_or_layout_ranks_running_different_ops_are_clustered_apart() -> None:
    stage_a = {"compute:embedding": 0.02, "compute:attention": 0.03}
    stage_b = {"compute:mlp": 0.02, "compute:cross_entropy": 0.03}
    docs = {r: make_doc(r, world=6, busy=stage_a if r < 3 else stage_b) for r in range(6)}
    g = peer_groups(window_columns(docs.values()))
    assert [(x.ranks, x.how) for x in g] == [([0, 1, 2], "op-mix clustering"), ([3, 4, 5], "op-mix clustering")]
    a = analyze(WindowData("w000-s30", docs))
    assert all(x.valid and "op-mix clustering" in x.reason for x in a.groups)


def test_a_lone_rank_with_odd_ops_stays_with_its_peers_and_durations_never_split_a_group() -> None:
    docs = {r: make_doc(r, busy={"compute:forward": 0.02, "compute:backward": 0.03}) for r in range(4)}
    docs[2] = make_doc(2, busy={"compute:strange_op": 0.05})        # a fault, not a design
    assert [x.ranks for x in peer_groups(window_columns(docs.values()))] == [[0, 1, 2, 3]]
    slow = {r: make_doc(r, busy={"compute:forward": 0.02 if r < 2 else 0.08}) for r in range(4)}
    assert [x.ranks for x in peer_groups(window_columns(slow.values()))] == [[0, 1, 2, 3]]


def test_a_declared_role_wins_over_clustering() -> None:
    docs = {r: make_doc(r, role="trainer", busy={"compute:a": 0.02} if r < 2 else {"compute:b": 0.02})
            for r in range(4)}
    assert [(x.name, x.how) for x in peer_groups(window_columns(docs.values()))] == [("trainer", "declared role")]


def test_two_tight_modes_of_compute_work_are_found_and_a_fault_is_not_a_mode() -> None:
    from eroica.engine.groups import bimodal_split

    assert bimodal_split([22.9, 26.2, 45.3, 41.1], 0.5) == ([0, 1], [2, 3])       # uneven by design
    assert bimodal_split([20.0, 21.0, 20.5, 80.0], 0.5) is None                   # one culprit is no mode
    assert bimodal_split([24.0, 19.2, 45.0, 76.5], 0.5) is None                   # culprit + a victim: loose
    assert bimodal_split([20.0, 21.0, 23.0, 24.0], 0.5) is None                   # noise
    assert bimodal_split([10, 10.5, 10.2, 10.1, 10.3, 10.4, 20.2, 20.5], 0.1) == ([0, 1, 2, 3, 4, 5], [6, 7])
    assert bimodal_split([10, 10.5, 10.2, 10.1, 10.3, 10.4, 10.2, 20.5], 0.1) is None  # 1 of 8: no mode
