from datetime import timedelta

import pytest

from eroica.collector.sync import LocalStore, WindowCoordinator


def test_first_proposal_wins_and_everyone_sees_it() -> None:
    store = LocalStore()
    a, b = WindowCoordinator(store, 0), WindowCoordinator(store, 3)
    assert b.poll(0) is None
    pa = a.propose(0, 40)
    pb = b.propose(0, 41)           # lost the race: gets rank 0's plan
    assert pa == pb and pa.start_step == 40 and pa.triggered_by_rank == 0
    assert b.poll(0) == pa
    assert a.poll(1) is None        # the next window index is still free


def test_real_tcp_store_has_the_same_semantics() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    from eroica.lab.launch import free_port

    port = free_port()
    server = torch_dist.TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    client = torch_dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=10))
    a, b = WindowCoordinator(server, 0), WindowCoordinator(client, 1)
    assert a.poll(0) is None
    plan = b.propose(0, 17)
    assert a.propose(0, 99) == plan
    assert a.poll(0).start_step == 17  # type: ignore[union-attr]
