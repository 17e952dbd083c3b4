"""Fixes proven to work, through the service: a user's training script whose rank 1 reads its samples
one by one from a volume that turned slow (num_workers=0) runs under `eroica run` against `eroica
serve`; the service opens a dataloader_stall issue; `eroica draft --verify CMD --link` takes the
window's diagnosis from the service, drafts more loader workers against a copy of the script, the gate
checks the draft, and the job is re-run with it applied and without it, under the same conditions.
The change request says what the re-runs measured, the draft is verified (the step back within 10% of
the job's healthy step: each re-run's own, before the slowdown's onset), and the issue is linked to the
verified change request.

A second script, nobody's instrumentation in it, waits on a metrics endpoint after every step; rank 1's
turned slow. The stack sampler names the user function (`report_metrics`) in time no recorded function
held, the finding is user_code, the draft moves the call off the step, and the re-run verifies it.
The same finding drafted by a model (`--backend openai`, a replayed reply: report every 10th step)
goes through the same gate and re-runs, and is verified the same way.

A third trims memory with gc.collect() after each step past its warm-up on a rank that holds more than
its budget: rank 1, which builds a large in-memory index of cyclic records before training, so each
of its steps walks the whole heap. The finding is gc_pause
in gc.collect on rank 1; the draft freezes what is alive before the loop (gc.freeze()), and the re-run
verifies that the collections no longer cost the step.

A fourth turns autograd anomaly detection on for one rank from step 30 (a debugging session's switch,
never taken out): framework_config on rank 1, the setting that differs named; the draft removes the
call, and the re-run verifies it.

A fifth saves a resume checkpoint with torch.save after every step, each rank to its own node-local
volume; from step 30 rank 1's is slow (a loop-device volume whose writes a blkio cgroup caps):
slow_storage in save_checkpoint on rank 1; the draft serializes in the step and writes in the
background, and the re-run measures it (the function must leave the step; the step is not judged).

A sixth shards a corpus of four interleaved sources, one of long documents, with an unshuffled
DistributedSampler; from step 30 the corpus is written round-robin, so rank 1 gets every long document
every step: workload_imbalance on rank 1; the draft shuffles that sampler, and the re-run verifies it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from model_replay import Replay, replay_server
from service_support import SERVE_TOKEN, get, serve

from eroica.cli.main import main
from eroica.collector.monitor import FORCE_ENV
from eroica.lab import volume

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parent / "verify_repos" / "slow_reads"
METRICS = Path(__file__).parent / "verify_repos" / "blocking_metrics"
INDEX = Path(__file__).parent / "verify_repos" / "metadata_index"
ANOMALY = Path(__file__).parent / "verify_repos" / "anomaly_debug"
CHECKPOINT = Path(__file__).parent / "verify_repos" / "local_checkpoint"
INTERLEAVED = Path(__file__).parent / "verify_repos" / "interleaved_sources"
WRITE_CAP = 16 * 1024 * 1024      # bytes/s to rank 1's volume: its 0.5 MB checkpoint takes ~33 ms to write
TORCHRUN = f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc-per-node 4 train.py"
JOB = "verify-slow-reads"


def test_a_loader_draft_is_verified_by_re_running_the_job_and_linked(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(SCRIPT, repo)
    eroica = str(Path(sys.executable).parent / "eroica")
    with serve(tmp_path) as url:
        res = subprocess.run([eroica, "run", "--sink", url, "--job", JOB, "--", *shlex.split(TORCHRUN),
                              "--steps", "100"], cwd=repo, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "EROICA_SINK_TOKEN": SERVE_TOKEN})
        assert res.returncode == 0, res.stderr[-2000:]
        job = next(j["id"] for j in get(f"{url}/v1/jobs") if j["name"] == JOB)  # type: ignore[union-attr]
        issue, deadline = None, time.time() + 60
        while issue is None and time.time() < deadline:
            issue = next((i for i in get(f"{url}/v1/issues?job={job}")  # type: ignore[union-attr]
                          if i["root_cause"] == "dataloader_stall" and "1" in i["ranks"].split(",")), None)
            time.sleep(0.3)
        assert issue is not None, (get(f"{url}/v1/jobs/{job}"), res.stderr[-1500:])
        # the issue's first window: its history holds the job's healthy step (a later window's already slow)
        first = next(h["window"] for h in issue["history"] if "window" in h)
        (tmp_path / "d.json").write_bytes(json.dumps(get(f"{url}/v1/windows/{first}/diagnosis")).encode())
        monkeypatch.setenv("EROICA_SINK_TOKEN", SERVE_TOKEN)
        assert main(["draft", str(tmp_path / "d.json"), "--repo", str(repo), "-o", str(tmp_path / "drafts"),
                     "--verify", f"{TORCHRUN} --steps 70", "--verify-window-step", "50",
                     "--link", url, "--job", job]) == 0
        out = capsys.readouterr().out
        drafts = json.loads((tmp_path / "drafts" / "drafts.json").read_text())
        (o,) = [o for o in drafts if o["root_cause"] == "dataloader_stall" and o["ranks"] == [
            int(r) for r in issue["ranks"].split(",")]]
        v = o["verification"]
        why = json.dumps(v) + out
        assert o["kind"] == "code" and v is not None and v["verified"], why
        assert v["before_step_seconds"] > 1.3 * v["after_step_seconds"], why       # unchanged, the re-run was slow
        assert v["step_to_healthy_ratio"] <= 1.1, why
        assert v["function"] == "DataLoader.__next__"
        assert v["after_function_seconds"] < 0.3 * v["before_function_seconds"], why
        text = (Path(o["directory"]) / "change_request.md").read_text()
        assert "**Verified by re-running the job.**" in text and f"Measured: {v['summary']}" in text
        linked = next(i for i in get(f"{url}/v1/issues?job={job}") if i["id"] == issue["id"])  # type: ignore[union-attr]
        assert linked["state"] == "linked" and linked["link_kind"] == "change_request", linked
        assert linked["link_url"].endswith("change_request.md") and v["summary"] in linked["history"][-1]["why"]
        assert f"linked to issue {issue['id']}" in out
    assert "num_workers=0" in (repo / "train.py").read_text()              # the user's code is untouched


def run_diagnose_and_verify(tmp_path: Path, source: Path, cause: str, finding_ok: Callable[[dict[str, Any]], bool],
                            monkeypatch: pytest.MonkeyPatch, capsys: Any, job_args: str = "",
                            wrap: Callable[[str], str] = lambda line: line,
                            judged: bool = True, draft_args: tuple[str, ...] = (),
                            window_at: int | None = None) -> tuple[dict[str, Any], str, str]:
    """The user's script run under `eroica run` (100 steps, rank 1 slow from step 30), diagnosed (some
    finding of `cause` on rank 1 must satisfy `finding_ok`), drafted against its repository and verified
    by re-running it 80 steps with and without the draft. `job_args` go to the script; `wrap` turns a
    shell line into the one that runs it under the fault's conditions (the same for every run). Unless
    not `judged`, the draft must be verified and the unchanged re-run 1.3x slower. (The outcome, why
    it is what it is, the diff.) `window_at`: the diagnosed run's window opened at that step by hand
    (EROICA_FORCE_WINDOW_AT_STEP, docs/attach.md), as an SRE does for a slowdown under the detector's noise."""
    repo = tmp_path / "repo"
    shutil.copytree(source, repo)
    eroica = str(Path(sys.executable).parent / "eroica")
    job = f"{TORCHRUN} {job_args}".strip()
    forced = f"env {FORCE_ENV}={window_at} " if window_at is not None else ""
    res = subprocess.run(["bash", "-c", wrap(f"{forced}{shlex.quote(eroica)} run "
                                             f"--out {shlex.quote(str(tmp_path / 'run'))} -- {job} --steps 100")],
                         cwd=repo, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert main(["diagnose", str(tmp_path / "run"), "--format", "json", "-o", str(tmp_path / "d.json")]) == 0
    found = [f for w in json.loads((tmp_path / "d.json").read_text())["windows"] for f in w["findings"]]
    assert any(f["root_cause"] == cause and f["ranks"] == [1] and f["confidence"] >= 0.5 and finding_ok(f)
               for f in found), [(f["root_cause"], f["ranks"], f["confidence"], f["function"], f["evidence"][:3])
                                 for f in found]
    # the re-runs' windows are 20 steps (the policy, through the environment the re-runs inherit):
    # their median step is steadier against this 2-core machine's noise than a 10-step window's
    monkeypatch.setenv("EROICA_POLICY_WINDOW_STEPS", "20")
    assert main(["draft", str(tmp_path / "d.json"), "--repo", str(repo), "-o", str(tmp_path / "drafts"),
                 "--verify", wrap(f"{job} --steps 80"), "--verify-window-step", "50", *draft_args]) == 0
    out = capsys.readouterr().out
    drafts = json.loads((tmp_path / "drafts" / "drafts.json").read_text())
    # the code draft (a hardware cause's ticket for its device comes beside it)
    code = [o for o in drafts if o["root_cause"] == cause and o["ranks"] == [1] and o["kind"] == "code"]
    assert len(code) == 1, drafts
    o = code[0]
    v = o["verification"]
    why = json.dumps(v) + out
    assert v is not None, why
    print(v["summary"], "(verified)" if v["verified"] else f"(not verified: {v['why']})")
    if judged:
        assert v["verified"], why
        assert v["before_step_seconds"] > 1.3 * v["after_step_seconds"], why   # unchanged, the re-run was slow
    return v, why, (Path(o["directory"]) / "patch.diff").read_text()


def test_a_blocking_call_found_by_sampling_is_moved_off_the_step_and_verified(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    v, why, diff = run_diagnose_and_verify(tmp_path, METRICS, "user_code", lambda f: f["function"] == "report_metrics",
                                           monkeypatch, capsys)
    assert v["function"] == "report_metrics" and v["after_function_seconds"] < 0.2 * v["before_function_seconds"], why
    assert "+        _eroica_background.submit(report_metrics, args, rank, step, loss.item())" in diff, diff
    assert "report_metrics(args, rank, step, loss.item())" in (tmp_path / "repo" / "train.py").read_text()  # untouched


def test_a_models_draft_goes_through_the_same_gate_and_re_run_as_a_templates(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The same blocking call, drafted through `--backend openai`: the model is sent the located call and
    answers with one line edit, which the gate checks and the re-runs measure like a template's draft.
    The model is a replay (tests/model_replay.py) answering what the remediation's guidance suggests
    ("call it every N steps"): no model these machines can run writes a fix reliably; the real small
    model's path is `make test-llm`."""
    lines = (METRICS / "train.py").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines, 1) if ln.strip() == "report_metrics(args, rank, step, loss.item())")
    edit = {"kind": "edit", "config": [], "rationale": "report the metrics every 10th step, not every step",
            "edit": {"start_line": at, "end_line": at, "replacement":
                     "        if step % 10 == 0:\n            report_metrics(args, rank, step, loss.item())"}}

    def answer(prompt: str) -> str:   # the user_code finding's call gets the edit; anything else a next step
        if f"Change only lines {at}-{at} of train.py" in prompt and "report_metrics" in prompt:
            return json.dumps(edit)
        return json.dumps({"kind": "none", "rationale": "measure it again"})

    with replay_server() as url:
        Replay.answer = answer
        v, why, diff = run_diagnose_and_verify(
            tmp_path, METRICS, "user_code", lambda f: f["function"] == "report_metrics", monkeypatch, capsys,
            draft_args=("--backend", "openai", "--base-url", url, "--model", "replay"))
    sent = [f for p, f in zip(Replay.prompts, Replay.formats) if f"Change only lines {at}-{at}" in p]
    assert sent, Replay.prompts
    # the schema the model was held to: only the located call's line
    assert sent[0]["json_schema"]["schema"]["properties"]["edit"]["properties"]["start_line"]["enum"] == [at]
    assert f"-{lines[at - 1]}" in diff and "+        if step % 10 == 0:" in diff, diff
    assert v["function"] == "report_metrics" and v["after_function_seconds"] < 0.3 * v["before_function_seconds"], why
    assert "if step % 10" not in (tmp_path / "repo" / "train.py").read_text()          # the user's code is untouched


def test_a_gc_draft_freezes_the_long_lived_heap_and_is_verified(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    v, why, diff = run_diagnose_and_verify(tmp_path, INDEX, "gc_pause", lambda f: "gc.collect" in (f["function"] or ""),
                                           monkeypatch, capsys)
    assert "gc.collect" in v["function"] and v["after_function_seconds"] < 0.3 * v["before_function_seconds"], why
    assert "+    gc.freeze()" in diff, diff
    assert "gc.freeze()" not in (tmp_path / "repo" / "train.py").read_text()     # the user's code is untouched


def test_anomaly_detection_left_on_is_turned_off_and_verified(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _v, _why, diff = run_diagnose_and_verify(
        tmp_path, ANOMALY, "framework_config", lambda f: any("detect_anomaly" in e for e in f["evidence"]),
        monkeypatch, capsys)
    assert "-            torch.autograd.set_detect_anomaly(True)" in diff, diff
    assert "set_detect_anomaly(True)" in (tmp_path / "repo" / "train.py").read_text()   # the user's code is untouched


def test_a_shard_fixed_by_index_is_shuffled_and_verified(tmp_path: Path, capsys,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _v, _why, diff = run_diagnose_and_verify(tmp_path, INTERLEAVED, "workload_imbalance", lambda f: True,
                                             monkeypatch, capsys)
    assert "-    sampler = DistributedSampler(corpus, num_replicas=world, rank=rank, shuffle=False)" in diff, diff
    assert "+    sampler = DistributedSampler(corpus, num_replicas=world, rank=rank, shuffle=True)" in diff, diff
    assert "shuffle=False)" in (tmp_path / "repo" / "train.py").read_text()         # the user's code is untouched


@pytest.mark.skipif(volume.unavailable() is not None, reason=str(volume.unavailable()))
def test_a_checkpoint_on_a_slow_volume_is_written_in_the_background_and_verified(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # the peers' volumes are healthy and local: a tmpfs, not this host's shared disk, whose other
    # writers would make the peers wait for I/O too
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="eroica-ckpt-", dir=shm) as peers, \
            volume.slow_volume(write_bytes_per_second=WRITE_CAP) as vol:
        ckpt = Path(peers)
        v, why, diff = run_diagnose_and_verify(
            tmp_path, CHECKPOINT, "slow_storage", lambda f: f["function"] == "save_checkpoint", monkeypatch, capsys,
            job_args=f"--ckpt-dir {shlex.quote(str(ckpt))} --slow-dir {shlex.quote(str(vol.mount))}", wrap=vol.enter,
            judged=False, window_at=46)
        assert (vol.mount / "latest.pt").stat().st_size > 0                  # rank 1 did write there
    # the diagnosed run's window is opened by hand at step 46 (its detector's reference then: steps 10-29,
    # before the onset at 30): a 1.2-1.4x slowdown is within the detector's noise on a busy 2-core host,
    # and two fresh-clone runs in a row opened no window at all (docs/benchmarks.md)
    # the save leaves rank 1's step. The job's step is not judged here: rank 1 blocked in I/O hands its
    # share of the two cores to the other three ranks, so the unchanged job is only 1.2-1.5x slower, and
    # the background write's kernel time still runs on the same two cores, so the draft lands at 0.99-1.13
    # of the healthy step (checkpointing to a healthy volume), across the 10% line on this host
    # (docs/benchmarks.md, "Drafts verified by re-running"); the draft must not make it slower (waiting
    # on the save in flight would), 5% allowed for the run-to-run spread
    assert v["function"] == "save_checkpoint" and v["after_function_seconds"] < 0.3 * v["before_function_seconds"], why
    assert v["after_step_seconds"] < 1.05 * v["before_step_seconds"], why
    assert "+    torch.save(model.state_dict(), _eroica_buffer)" in diff, diff
    assert "torch.save(model.state_dict(), os.path.join(directory" in (tmp_path / "repo" / "train.py").read_text()
