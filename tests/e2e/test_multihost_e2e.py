"""Many hosts, proven on one machine: 4 simulated hosts (each its own network namespace, hostname,
/tmp, /etc/hosts and cpu cgroup: eroica.lab.hosts) x 2 ranks, one multi-node `torchrun` (c10d
rendezvous) attached by `eroica run`, sending to one `eroica serve` over the hosts' links.

- every host runs its own sampler helper; the service lists the job's four hosts;
- a host-wide fault (host 2's cgroup throttled) is named once, as that host's problem, and the
  drain list proposes that host;
- a rank-local fault on a two-rank host names the rank, not its host;
- in a hang, a host whose link went down is named across hosts by its ranks' aged heartbeats in
  the job's store (no peer on its host to check a pid), while the other hosts' ranks wait;
- the time from the fault to the stored finding, through the service, is reported."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from service_support import SERVE_TOKEN, get, serve

from eroica.lab.hosts import Hosts, available

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
OK, WHY = available()
HOSTS, PER_HOST = 4, 2


@contextlib.contextmanager
def cluster(tmp: Path) -> Iterator[tuple[Hosts, str]]:
    hosts = Hosts(HOSTS, tmp / "hosts").create()
    try:
        with serve(tmp, "--drain-min-jobs", "1", host=hosts.bridge_ip) as url:
            yield hosts, url
    finally:
        assert hosts.cleanup() == []


def start_job(hosts: Hosts, url: str, tmp: Path, job: str, steps: int, *script: str,
              env_extra: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    port = 29400 + int(hosts.tag, 16) % 500
    procs = []
    for i in range(HOSTS):
        out = tmp / f"h{i}" / job           # the same run name on every host: one job id at the service
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "eroica.cli.main", "run", "--out", str(out), "--sink", url, "--job", job, "--",
                sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS), "--nproc-per-node",
                str(PER_HOST), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.name(0)}:{port}",
                "--rdzv-id", f"{job}-{hosts.tag}", "--max-restarts", "0", "--monitor-interval", "1",
                str(ROOT / "examples" / "train_ddp.py"), "--steps", str(steps), *script]
        env = {**os.environ, "EROICA_SINK_TOKEN": SERVE_TOKEN, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", **(env_extra or {})}
        with (tmp / f"h{i}-{job}.log").open("wb") as log:     # the child keeps its own copy of the handle
            procs.append(subprocess.Popen(hosts.command(i, argv, keep=[tmp, ROOT]), env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    return procs


def until(cond: Callable[[], Any], timeout: float, procs: list[subprocess.Popen[bytes]], tmp: Path) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            got = cond()
        except TimeoutError:       # the service shares 2 cores with 8 ranks starting up: ask again
            got = None
        if got:
            return got
        if all(p.poll() is not None for p in procs):
            got = cond()
            if got:
                return got
            logs = "\n".join(f.read_text(errors="replace")[-1500:] for f in sorted(tmp.glob("h*-*.log")))
            raise AssertionError(f"the job ended first: {[p.returncode for p in procs]}\n{logs}")
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()          # a hung host's chain (nsenter, eroica run, torchrun): the cgroup kill ends the rest
            p.wait(30)


def job_id(url: str, name: str) -> str | None:
    jobs = get(url + "/v1/jobs")
    assert isinstance(jobs, list)
    return next((j["id"] for j in jobs if j["name"] == name), None)


def helpers_by_host(hosts: Hosts) -> dict[int, int]:
    """Sampler helper processes on each host (found by the host's cgroup)."""
    out = {}
    for i in range(HOSTS):
        n = 0
        for pid in hosts.pids(i):
            with contextlib.suppress(psutil.Error):
                if "sampler_proc" in " ".join(psutil.Process(pid).cmdline()) or "host_sampler" in " ".join(
                        psutil.Process(pid).cmdline()):
                    n += 1
        out[i] = n
    return out


@contextlib.contextmanager
def healthy(hosts: Hosts, url: str, tmp: Path, job: str, steps: int,
            env_extra: dict[str, str] | None = None) -> Iterator[tuple[list[subprocess.Popen[bytes]], str]]:
    """The job started on every host and healthy for a while (two step summaries at the service: the
    detector learns the job's step time from its own history); its processes and its id. Stopped
    on the way out."""
    procs = start_job(hosts, url, tmp, job, steps, env_extra=env_extra)
    try:
        jid = until(lambda: job_id(url, job), 240, procs, tmp)
        until(lambda: len((get(f"{url}/v1/jobs/{jid}") or {}).get("steps", [])) >= 2, 240, procs, tmp)
        yield procs, jid
    finally:
        stop(procs)


def hang_verdict(url: str, jid: str, seen: list[Any]) -> Any:
    """The job's hang verdict at the service (None before any snapshot: the watchdogs wait for the
    hang limit), each one kept in `seen`."""
    try:
        f = get(f"{url}/v1/jobs/{jid}/hang")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    seen.append(f)
    return f


HANG_ENV = {"EROICA_POLICY_HANG_FLOOR_SECONDS": "10"}


def what_happened(tmp: Path, job: str, seen: list[Any]) -> str:
    """For a failed hang test: the last verdict, the snapshots on each host's disk, and the lines
    eroica and torchrun's agents wrote on each host."""
    said = [f"{log.name}: {ln}" for log in sorted(tmp.glob(f"h*-{job}.log"))
            for ln in log.read_text(errors="replace").splitlines()
            if "eroica" in ln or "torch.distributed.elastic" in ln or "Signal" in ln][-60:]
    on_disk = sorted(str(p.relative_to(tmp)) for p in tmp.glob(f"h*/{job}*/**/*.hang.json"))
    return (f"last verdict: {seen[-1] if seen else None}; snapshots on disk: {on_disk}; what eroica and the "
            "agents said:\n" + "\n".join(said))


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_host_wide_fault_is_the_hosts_problem_named_once_and_the_host_is_proposed_for_draining(
        tmp_path: Path) -> None:
    with cluster(tmp_path) as (hosts, url), healthy(hosts, url, tmp_path, "mh-host", 400) as (procs, jid):
        t_fault = time.time()
        hosts.throttle(2, 0.25)           # host 2's cgroup: both its ranks starve together
        helpers: dict[int, int] = {}

        def found() -> Any:
            for i, n in helpers_by_host(hosts).items():      # the helpers live while windows are open
                helpers[i] = max(helpers.get(i, 0), n)
            # a window may first name one of the host's ranks (the other's evidence not yet clear):
            # the job runs on and a later window names the host
            return next((f for f in get(f"{url}/v1/findings?job={jid}&min_confidence=0.5") or []
                         if f["hosts"] == [hosts.name(2)] and len(f["ranks"]) == PER_HOST), None)
        f = until(found, 300, procs, tmp_path)
        t_found = time.time()
        job = get(f"{url}/v1/jobs/{jid}")
        drain = get(f"{url}/v1/drain")
        d = get(f"{url}/v1/windows/{f['window_pk']}/diagnosis")
    print(f"host-wide fault to stored finding: {t_found - t_fault:.1f} s ({f['root_cause']}, ranks {f['ranks']})")
    assert isinstance(job, dict) and job["hosts"] == sorted(hosts.name(i) for i in range(HOSTS))
    assert job["world_size"] == HOSTS * PER_HOST
    assert helpers == {i: 1 for i in range(HOSTS)}, helpers             # one sampler helper per host
    assert f["category"] == "hardware" and f["root_cause"] in ("cpu_throttled", "cpu_contention"), f
    assert len(f["ranks"]) == PER_HOST                                  # named once, for the host's two ranks
    assert isinstance(d, dict)
    (wf,) = [x for x in d["windows"][0]["findings"] if x["root_cause"] == f["root_cause"]]
    assert wf["scope"] == "host" and wf["summary"].startswith(f"host {hosts.name(2)}:")
    assert wf["devices"] == [f"{hosts.name(2)}/cpu"]                   # host/device (one CPU "device" a host)
    assert isinstance(drain, dict) and hosts.name(2) in [h["host"] for h in drain["hosts"]], drain


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_hosts_capped_link_is_the_hosts_problem_named_once(tmp_path: Path) -> None:
    with cluster(tmp_path) as (hosts, url), healthy(hosts, url, tmp_path, "mh-link", 400) as (procs, jid):
        t_fault = time.time()
        hosts.cap_link(1, 40)             # host 1's link: both its ranks' traffic squeezed together
        seen: list[Any] = []

        def found() -> Any:
            seen[:] = get(f"{url}/v1/findings?job={jid}&min_confidence=0.5") or []
            return next((f for f in seen if f["hosts"] == [hosts.name(1)] and len(f["ranks"]) == PER_HOST), None)
        try:
            f = until(found, 300, procs, tmp_path)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; findings: {[(x['root_cause'], x['ranks']) for x in seen]}") from None
        t_found = time.time()
        d = get(f"{url}/v1/windows/{f['window_pk']}/diagnosis")
    print(f"capped host link to stored finding: {t_found - t_fault:.1f} s ({f['root_cause']}, ranks {f['ranks']})")
    assert f["category"] == "hardware" and len(f["ranks"]) == PER_HOST, f
    assert isinstance(d, dict)
    (wf,) = [x for x in d["windows"][0]["findings"] if x["root_cause"] == f["root_cause"]]
    assert wf["scope"] == "host" and wf["summary"].startswith(f"host {hosts.name(1)}:")


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_rank_local_fault_on_a_two_rank_host_names_the_rank_not_the_host(tmp_path: Path) -> None:
    with cluster(tmp_path) as (hosts, url):
        procs = start_job(hosts, url, tmp_path, "mh-rank", 400, "--fault", "dataloader_stall", "--fault-rank", "5",
                          "--fault-step", "40")
        try:
            jid = until(lambda: job_id(url, "mh-rank"), 240, procs, tmp_path)
            f = until(lambda: next((f for f in get(f"{url}/v1/findings?job={jid}&min_confidence=0.5") or []
                                    if f["root_cause"] == "dataloader_stall"), None), 400, procs, tmp_path)
            d = get(f"{url}/v1/windows/{f['window_pk']}/diagnosis")
        finally:
            stop(procs)
    assert f["ranks"] == [5], f
    assert isinstance(d, dict)
    (wf,) = [x for x in d["windows"][0]["findings"] if x["root_cause"] == "dataloader_stall"]
    assert wf["scope"] == "rank" and len(wf["hosts"]) == 1


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_host_cut_off_in_a_hang_is_named_across_hosts_while_the_others_wait(tmp_path: Path) -> None:
    with (cluster(tmp_path) as (hosts, url),
          healthy(hosts, url, tmp_path, "mh-hang", 100000, HANG_ENV) as (procs, jid)):
        t_fault = time.time()
        hosts.link_down(3)                # host 3 falls off the network: every collective stops
        seen: list[Any] = []

        def named() -> Any:
            f = hang_verdict(url, jid, seen)
            ok = (isinstance(f, dict) and f["root_cause"] == "rank_died" and f["hosts"] == [hosts.name(3)]
                  and len(f["ranks"]) == PER_HOST)     # both its ranks' heartbeats aged past the limit
            return f if ok else None
        try:
            f = until(named, 180, procs, tmp_path)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {what_happened(tmp_path, 'mh-hang', seen)}") from None
        t_found = time.time()
        waiting = [p.poll() is None for p in procs[:3]]
    print(f"host cut off to its hang verdict: {t_found - t_fault:.1f} s (ranks {f['ranks']})")
    assert len(f["ranks"]) == PER_HOST and f["category"] == "hardware", f
    assert f["summary"].startswith(f"host {hosts.name(3)}:"), f
    assert all(waiting), "the other hosts' ranks should still be waiting in the collective"


@pytest.mark.skipif(not OK, reason=WHY)
def test_a_killed_host_is_named_from_the_survivors_snapshots(tmp_path: Path) -> None:
    """Every process of host 3 killed (the host died): the other hosts' collectives fail (their
    peer's connection reset) and their watchdogs send what they saw; the verdict names host 3's two
    ranks and the host, from the store's heartbeats, with no peer on host 3 to check a pid."""
    with (cluster(tmp_path) as (hosts, url),
          healthy(hosts, url, tmp_path, "mh-kill", 100000, HANG_ENV) as (_procs, jid)):
        t_fault = time.time()
        hosts.kill(3)
        seen: list[Any] = []
        deadline = time.time() + 120
        f = None
        while f is None and time.time() < deadline:      # the job ends meanwhile (its collectives failed)
            v = hang_verdict(url, jid, seen)
            ok = isinstance(v, dict) and v["root_cause"] == "rank_died" and v["hosts"] == [hosts.name(3)]
            f = v if ok and v["ranks"] == [2 * 3, 2 * 3 + 1] else None
            time.sleep(0.5)
        assert f is not None, what_happened(tmp_path, "mh-kill", seen)
        t_found = time.time()
    print(f"host killed to its verdict: {t_found - t_fault:.1f} s (ranks {f['ranks']})")
    assert f["summary"].startswith(f"host {hosts.name(3)}:"), f
