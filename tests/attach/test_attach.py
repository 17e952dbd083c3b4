"""Zero-code attach in real processes (one rank, gloo): what counts as a step (optimizer steps, not
micro-batches; one per iteration with two optimizers; an AMP step GradScaler skipped still ends its
iteration; the overrides), the explicit API winning, and every way attaching can fail leaving the
user's program to finish."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eroica.cli.run_cmd import BOOTSTRAP, PTH_LINE

pytest.importorskip("torch")

LOOP = textwrap.dedent('''
    import json, os, sys, torch, torch.distributed as dist, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    EXPLICIT = os.environ.get("EXPLICIT") == "1"
    def train_step(i):
        for micro in range(3):                      # gradient accumulation: 3 micro-batches per step
            x, y = next(it)
            loss = nn.functional.cross_entropy(model(x), y)
            if i % 10 == 5 and micro == 0:
                loss = loss * float("inf")          # AMP sees inf grads: GradScaler skips this step
            scaler.scale(loss).backward()
        for o in opts:
            scaler.step(o)
        scaler.update()
        for o in opts:
            o.zero_grad()
        if EXPLICIT:
            mon.step()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
    if EXPLICIT:
        from eroica.collector import Monitor
        mon = Monitor(out_dir=os.environ["EXPLICIT_OUT"], gather=False)
    model = nn.Linear(8, 2)
    params = list(model.parameters())
    opts = [torch.optim.SGD(params[:1], lr=0.1), torch.optim.SGD(params[1:], lr=0.1)]
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(TensorDataset(torch.randn(400, 8), torch.randint(0, 2, (400,))), batch_size=4)
    it = iter(loader)
    for i in range(30):
        train_step(i)
    from eroica.collector import attach
    m = attach.S.monitor
    print("RESULT " + json.dumps({"attached": m is not None, "steps": m._step if m else None,
                                  "explicit": attach.S.explicit, "dead": attach.S.dead,
                                  "explicit_steps": mon._step if EXPLICIT else None,
                                  "loader": (m.config if m else {}).get("dataloader.batch_size")}))
    if EXPLICIT:
        mon.close()
    dist.destroy_process_group()
''')


def _port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_attached(tmp: Path, script: str = LOOP, python: str = sys.executable, **env: str) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    f = tmp / "train.py"
    f.write_text(script)
    e = {**os.environ, "EROICA_ATTACH": "1", "PYTHONPATH": str(BOOTSTRAP), "EROICA_OUT": str(tmp / "run"),
         "PORT": _port(), **env}
    p = subprocess.run([python, str(f)], env=e, capture_output=True, text=True, timeout=180, cwd=tmp)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return p.returncode, p.stdout + p.stderr, json.loads(line[7:]) if line else {}


def test_a_step_is_an_optimizer_step_once_per_iteration_even_when_amp_skips_it(tmp_path: Path) -> None:
    rc, out, r = run_attached(tmp_path)
    assert rc == 0, out
    assert r["attached"] and not r["dead"], out
    assert r["steps"] == 30, r          # not 90 micro-batches, not 60 optimizer.step calls, skips counted
    assert r["loader"] == "4"           # the DataLoader's settings, read without replacing it
    assert "eroica attach" not in out   # nothing to say when it works


def test_the_explicit_api_wins_and_nothing_is_counted_twice(tmp_path: Path) -> None:
    rc, out, r = run_attached(tmp_path, EXPLICIT="1", EXPLICIT_OUT=str(tmp_path / "explicit"))
    assert rc == 0, out
    assert (r["attached"], r["explicit"], r["explicit_steps"]) == (False, True, 30), r


def test_the_step_overrides_count_batches_or_a_named_function(tmp_path: Path) -> None:
    rc, out, r = run_attached(tmp_path, EROICA_STEP="__main__:train_step")
    assert rc == 0 and r["steps"] == 30, out
    rc, out, r = run_attached(tmp_path, EROICA_STEP="dataloader")
    assert rc == 0 and r["steps"] == 89, out      # 90 batches of the first loader end 89 steps


@pytest.mark.parametrize("why, env", [
    ("an unwritable run directory", {"EROICA_OUT": "/proc/eroica-cannot-write-here"}),
    ("a sink that is down", {"EROICA_SINK": "http://127.0.0.1:9", "EROICA_SINK_TOKEN": "x"}),
    ("a bad step override", {"EROICA_STEP": "no_such_module_xyz:f"}),
])
def test_a_failure_to_attach_never_stops_the_users_job(tmp_path: Path, why: str, env: dict[str, str]) -> None:
    rc, out, r = run_attached(tmp_path, **env)
    assert rc == 0 and r, f"{why}: {out}"          # every step ran and the program finished


def test_a_torch_it_does_not_know_is_one_line_and_an_unwatched_job(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        import json, os, torch, torch.distributed as dist
        import torch.optim.optimizer as o
        del o.register_optimizer_step_post_hook          # a torch before the global optimizer hooks
        from eroica.collector import attach
        attach.on_torch(torch)
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
        m = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(2, 4)).sum().backward()
            opt.step()
        dist.destroy_process_group()
        print("RESULT " + json.dumps({"dead": attach.S.dead, "monitor": attach.S.monitor is not None}))
    ''')
    rc, out, r = run_attached(tmp_path, script, EROICA_ATTACH="0")
    assert rc == 0 and r == {"dead": True, "monitor": False}, out
    assert "eroica attach" in out and "the job runs unwatched" in out


def test_a_broken_eroica_install_leaves_the_program_running(tmp_path: Path) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or python == sys.executable:
        pytest.skip("needs a system python3 without eroica installed")
    rc, out, _ = run_attached(tmp_path, "print('RESULT {\"ran\": true}')", python=python)
    assert rc == 0 and 'RESULT {"ran": true}' in out, out
    assert "eroica attach: not attached" in out


def test_the_platform_pth_line_attaches_when_the_environment_asks(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "eroica-attach.pth").write_text(PTH_LINE)
    script = textwrap.dedent(f'''
        import site; site.addsitedir({str(site_dir)!r})
        import torch, torch.distributed as dist
        print("RESULT " + __import__("json").dumps({{"patched": getattr(dist.init_process_group, "_eroica", False)}}))
    ''')
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for flag, want in (("1", True), ("0", False)):
        p = subprocess.run([sys.executable, "-c", script], env={**e, "EROICA_ATTACH": flag}, capture_output=True,
                           text=True, timeout=120)
        assert f'RESULT {{"patched": {str(want).lower()}}}' in p.stdout, p.stdout + p.stderr
