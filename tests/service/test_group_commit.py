"""Group commit: uploads that wait while another is written are written together in one transaction,
and each request still gets its own answer (stored, already there, or refused) only after its own
documents are committed. The writes are real (SQLite and PostgreSQL); the first write is held until
the others are waiting, so every run forms the same groups."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from polling import until
from service_support import PG, PG_WHY, database, incident_docs

from eroica.engine.load import parse_doc
from eroica.service import bulk
from eroica.service.bulk import BulkIngested, Prepared
from eroica.service.db import batch_columns, batches, documents, make_engine, migrate, windows
from eroica.service.errors import Conflict
from eroica.service.group_commit import GroupCommit

WITH_PG = pytest.param("postgresql", marks=pytest.mark.skipif(not PG, reason=PG_WHY))


def host_batches(hosts: int, per_host: int = 4, **change: object) -> list[list[tuple[int, object, bytes]]]:
    """A (hosts x per_host)-rank window's documents (re-ranked from one incident's), one batch a host."""
    base = json.loads(incident_docs("INC-0017")[0])
    out = []
    for h in range(hosts):
        lines = []
        for i in range(per_host):
            o = json.loads(json.dumps(base))
            o["job"].update(rank=h * per_host + i, world_size=hosts * per_host, hostname=f"node-{h}")
            o.update(change)
            text = json.dumps(o).encode()
            lines.append((i + 1, parse_doc(text, "test", one_line=True), text))
        out.append(lines)
    return out


class Held:
    """`bulk.write` on `eng`, its first call held until `release` is set; the groups it was given."""

    def __init__(self, eng: sa.Engine) -> None:
        self.eng, self.release, self.groups = eng, threading.Event(), []   # type: ignore[var-annotated]
        self.entered = threading.Event()

    def __call__(self, group: list[Prepared]) -> list[BulkIngested]:
        self.groups.append([p.size for p in group])
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30)
        return bulk.write(self.eng, group)


@pytest.fixture(params=["sqlite", WITH_PG])
def eng(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    with database(request.param, tmp_path) as url:
        e = make_engine(url)
        migrate(e)
        yield e
        e.dispose()


def submit_all(gc: GroupCommit, held: Held, uploads: list[Prepared],
               waiting: Callable[[], int]) -> list[BulkIngested | BaseException]:
    """Submit every upload from its own thread: the first is held inside its write until all the
    others wait; each thread's outcome, in upload order."""
    def one(p: Prepared) -> BulkIngested | BaseException:
        try:
            return gc.submit(p)
        except BaseException as exc:  # noqa: BLE001
            return exc
    with ThreadPoolExecutor(len(uploads)) as ex:
        first = ex.submit(one, uploads[0])
        assert held.entered.wait(30)
        rest = [ex.submit(one, p) for p in uploads[1:]]
        until(lambda: waiting() == len(uploads) - 1, 30, "every other upload waiting")
        held.release.set()
        return [first.result(), *(f.result() for f in rest)]


def count(eng: sa.Engine, table: sa.Table) -> int:
    with eng.connect() as c:
        return int(c.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_uploads_waiting_behind_a_write_are_written_together(eng: sa.Engine) -> None:
    held = Held(eng)
    gc = GroupCommit(held)
    uploads = [bulk.prepare("wide", docs) for docs in host_batches(6)]
    got = submit_all(gc, held, uploads, lambda: len(gc._waiting))
    assert [(g.created, g.existing) for g in got if isinstance(g, BulkIngested)] == [(4, 0)] * 6
    assert held.groups == [[4], [4] * 5]          # the first alone, the five that waited in one transaction
    assert (gc.groups, gc.uploads) == (2, 6)
    assert count(eng, documents) == 24 and count(eng, batches) == 6 and count(eng, batch_columns) == 6
    with eng.connect() as c:
        assert c.execute(sa.select(windows.c.ranks_reported)).scalar_one() == 24


def test_a_refused_upload_does_not_refuse_the_others_of_its_group(eng: sa.Engine) -> None:
    """Rank 4 is stored with one document; a group holding a different document for it and two good
    uploads fails as a whole, and each is written again alone: only that one is refused."""
    first = host_batches(3)
    bulk.write(eng, [bulk.prepare("wide", first[1][:1])])                 # rank 4, as it was
    other = host_batches(3, step_times={**json.loads(first[1][0][2])["step_times"], "baseline_median_seconds": 9.0})
    held = Held(eng)
    gc = GroupCommit(held)
    uploads = [bulk.prepare("wide", first[0]), bulk.prepare("wide", other[1]), bulk.prepare("wide", first[2])]
    got = submit_all(gc, held, uploads, lambda: len(gc._waiting))
    assert isinstance(got[0], BulkIngested) and isinstance(got[2], BulkIngested)
    assert isinstance(got[1], Conflict) and "rank 4" in str(got[1])
    assert (got[0].created, got[2].created) == (4, 4)
    assert held.groups == [[4], [4, 4], [4], [4]]  # the group of two refused, then each alone
    assert count(eng, documents) == 9 and count(eng, batches) == 3   # rank 4's first batch, and two


def test_the_same_ranks_twice_are_never_in_one_group(eng: sa.Engine) -> None:
    """A host's batch sent again while the first copy waits: the copies go in different transactions,
    the first stores it, the second finds it there (nothing stored twice, nothing refused)."""
    docs = host_batches(3)
    held = Held(eng)
    gc = GroupCommit(held)
    uploads = [bulk.prepare("wide", docs[0]), bulk.prepare("wide", docs[1]), bulk.prepare("wide", docs[1]),
               bulk.prepare("wide", docs[2])]
    got = submit_all(gc, held, uploads, lambda: len(gc._waiting))
    assert [(g.created, g.existing) for g in got if isinstance(g, BulkIngested)] == [(4, 0), (4, 0), (0, 4), (4, 0)]
    assert held.groups == [[4], [4, 4], [4]]
    assert count(eng, documents) == 12 and count(eng, batches) == 3   # the copy's batch row is not kept


def test_a_failing_write_answers_its_requests_and_the_next_upload_is_written(tmp_path: Path) -> None:
    """A database error reaches the requests whose documents it concerned, and the writing passes on:
    nothing waits for ever."""
    eng = make_engine(f"sqlite:///{tmp_path / 'e.db'}")
    migrate(eng)
    docs = host_batches(2)
    calls = []

    def write(group: list[Prepared]) -> list[BulkIngested]:
        calls.append(len(group))
        if len(calls) == 1:
            raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))
        return bulk.write(eng, group)

    gc = GroupCommit(write)
    with pytest.raises(sa.exc.OperationalError):
        gc.submit(bulk.prepare("wide", docs[0]))
    assert gc.submit(bulk.prepare("wide", docs[1])).created == 4
    assert not gc._writing and not gc._waiting
    eng.dispose()


def test_write_refuses_a_group_with_one_rank_twice(tmp_path: Path) -> None:
    eng = make_engine(f"sqlite:///{tmp_path / 'e.db'}")
    migrate(eng)
    docs = host_batches(1)[0]
    with pytest.raises(ValueError, match="same rank"):
        bulk.write(eng, [bulk.prepare("wide", docs), bulk.prepare("wide", docs[:1])])
    assert count(eng, documents) == 0
    eng.dispose()
