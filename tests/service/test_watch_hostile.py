"""A watched root is untrusted input (the attacks once found, each reproduced): a FIFO does not stop ingestion, a
symlink does not leave the root, a file over the body limit and a gzip bomb in a spool are refused by size before
and after decompression, and a root writes only the jobs of its scope and never a job a writer of another scope
created."""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa
from service_support import incident_docs

from eroica.service.app import Service, Settings
from eroica.service.db import jobs, traces_of
from eroica.service.runs import claim_writer
from eroica.service.watch import Watcher

DOC = incident_docs("INC-0017")[0]


def service(tmp: Path, **kw: object) -> Service:
    return Service(Settings(db_url=f"sqlite:///{tmp / 'w.db'}", **kw))  # type: ignore[arg-type]


def known(svc: Service) -> set[str]:
    with svc.eng.connect() as c:
        return set(c.execute(sa.select(jobs.c.id)).scalars())


def scan_within(w: Watcher, seconds: float = 30) -> int:
    """One reconcile scan, which must finish (a FIFO opened for reading would block it for ever)."""
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(w.scan()), daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"the scan did not finish in {seconds} s"
    return got[0]


def test_a_fifo_in_the_root_is_never_opened_and_ingestion_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "job-f" / "w000-s10").mkdir(parents=True)
    os.mkfifo(root / "job-f" / "w000-s10" / "rank-0.json")           # nobody will ever write it
    (root / "job-g" / "w000-s10").mkdir(parents=True)
    (root / "job-g" / "w000-s10" / "rank-0.json").write_bytes(DOC)
    svc = service(tmp_path)
    try:
        assert scan_within(Watcher(svc, [root])) == 1
        assert known(svc) == {"job-g"}
    finally:
        svc.stop()


def test_a_symlink_never_takes_a_file_from_outside_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "doc.json").write_bytes(DOC)
    (outside / "trace.json").write_text('{"traceEvents": [], "secret": "outside the root"}')
    root = tmp_path / "runs"
    w = root / "job-s" / "w000-s10"
    w.mkdir(parents=True)
    (w / "rank-0.json").symlink_to(outside / "doc.json")
    (w / "rank-1.trace.json").symlink_to(outside / "trace.json")
    (root / "job-d").mkdir()
    (root / "job-d" / "w000-s10").symlink_to(outside, target_is_directory=True)   # a directory leading out
    svc = service(tmp_path)
    try:
        watcher = Watcher(svc, [root])
        assert scan_within(watcher) == 0
        assert watcher.consider(root / "job-d" / "w000-s10" / "rank-0.json") == 0    # as inotify would say it
        assert known(svc) == set()
        # the job becomes known by a real file; its symlinked trace is still not stored
        (w / "rank-2.json").write_bytes(DOC)
        assert scan_within(watcher) == 1
        with svc.eng.connect() as c:
            assert not traces_of(c, "job-s")
    finally:
        svc.stop()


def test_a_file_over_the_limit_and_a_gzip_bomb_in_a_spool_are_refused_by_size(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    big = root / "job-b" / "w000-s10" / "rank-0.json"
    big.parent.mkdir(parents=True)
    big.write_bytes(b" " * (3 << 20) + DOC)                             # valid JSON, 3 MB over
    spool = root / "job-c" / ".spool" / "rank-0"
    spool.mkdir(parents=True)
    (spool / "meta.json").write_text(json.dumps({"job_id": "job-c"}))
    bomb = spool / f"{1000:020d}-{0:06d}-patterns.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (300 << 20), 9))             # 300 MB once decompressed
    assert bomb.stat().st_size < 1 << 20
    svc = service(tmp_path, max_body_bytes=1 << 20)
    rss0 = psutil.Process().memory_info().rss
    try:
        assert scan_within(Watcher(svc, [root])) == 0
        assert psutil.Process().memory_info().rss - rss0 < 100 << 20     # never inflated whole
        assert known(svc) == set() and bomb.exists()
    finally:
        svc.stop()


@pytest.mark.parametrize("scoped", [True, False])
def test_a_root_writes_only_its_scope_and_never_a_job_another_writer_created(tmp_path: Path, scoped: bool) -> None:
    root = tmp_path / "runs"

    def spool(run: str, job_id: str, name: str, kind: str = "end", body: bytes = b"{}") -> Path:
        d = root / run / ".spool" / "rank-0"
        d.mkdir(parents=True, exist_ok=True)
        (d / "meta.json").write_text(json.dumps({"job_id": job_id, "job_name": name}))
        f = d / f"{1000:020d}-{0:06d}-{kind}.json.gz"
        f.write_bytes(gzip.compress(body))
        return f

    svc = service(tmp_path)
    try:
        # team b's job, created through the API by team b's token
        assert claim_writer(svc.eng, "team-b.run-1", "scope:team-b*") is None
        svc.accept("team-b.run-1", DOC, "api", name="team-b")
        theirs = spool("mine", "team-b.run-1", "team-b")              # a spool naming it, in team a's root
        ours = spool("ours", "team-a.run-2", "team-a", "patterns", DOC)
        watcher = Watcher(svc, [f"{root}=team-a*" if scoped else root])
        scan_within(watcher)
        assert theirs.exists() and not ours.exists()                  # not read, and left for whoever owns it
        with svc.eng.connect() as c:
            ended = c.execute(sa.select(jobs.c.ended_at).where(jobs.c.id == "team-b.run-1")).scalar()
        assert ended is None and "team-a.run-2" in known(svc)
        # the job the root created is bound to its scope: a token of that scope may write it (its own team's
        # sink, after the root replayed a spool), one of a wider scope may not
        glob = "team-a*" if scoped else "*"
        assert claim_writer(svc.eng, "team-a.run-2", f"scope:{glob}") is None
        assert claim_writer(svc.eng, "team-a.run-2", "scope:team-*") is not None
    finally:
        svc.stop()


def test_a_teams_root_replays_what_its_sink_spooled_for_a_job_its_token_created(tmp_path: Path) -> None:
    """The documented path: a job's sink posts with the team's token, the service is down for a while, the job
    exits with its spool full; the service watching the team's root (given the token's glob) replays it."""
    root = tmp_path / "runs"
    svc = service(tmp_path)
    try:
        assert claim_writer(svc.eng, "team-a.run-3", "scope:team-a*") is None      # the token's first post
        svc.accept("team-a.run-3", DOC, "api", name="team-a")
        d = root / "run-3" / ".spool" / "rank-1"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"job_id": "team-a.run-3", "job_name": "team-a"}))
        (d / f"{1000:020d}-{0:06d}-end.json.gz").write_bytes(gzip.compress(b"{}"))
        scan_within(Watcher(svc, [f"{root}=team-a*"]))
        assert not list(d.glob("*.json.gz"))
        with svc.eng.connect() as c:
            assert c.execute(sa.select(jobs.c.ended_by).where(jobs.c.id == "team-a.run-3")).scalar() == "job"
    finally:
        svc.stop()


def test_an_empty_scope_is_refused_at_start_and_a_symlink_is_named_as_one(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                                          caplog) -> None:
    from eroica.cli.main import main

    # `ROOT=` (a template's unset variable) would widen a team's root to every job
    assert main(["serve", "--data", str(tmp_path / "d"), "--watch", f"{tmp_path}="]) == 2
    assert "the scope after '=' is empty" in capsys.readouterr().err
    root = tmp_path / "root"
    run = root / "team-a.1" / "w000-s20"
    run.mkdir(parents=True)
    (tmp_path / "outside.json").write_text("{}")
    (run / "rank-0.json").symlink_to(tmp_path / "outside.json")
    svc = service(tmp_path)
    w = Watcher(svc, [f"{root}=team-a*"])
    with caplog.at_level("WARNING"):
        scan_within(w, 5)
    assert "a symbolic link: never followed" in caplog.text, caplog.text
