"""eroica built and installed as a user installs it: the wheel and the sdist from `python -m build`, their
metadata checked by twine, the wheel installed into clean virtual environments.

- collector only, on Python 3.13 (where the engine cannot run: durable-rules does not import there): a plain
  Python loop watched by the Monitor records a window without torch, nothing of the engine, the service or the
  assistant is imported, and a command that needs an extra says which;
- `eroica[all]` on Python 3.11, installed as deploy/docker/Dockerfile does (wheels built, then installed with no
  index): a real 2-rank DDP job attached with `eroica run` is diagnosed by the installed `eroica diagnose`.

Each environment lives in the test's temp dir, outside the repository, so nothing is imported from the
checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
PIP = ["-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check"]


def python(version: str) -> str:
    """An interpreter of `version` (pyenv's, as on these machines, else one on PATH)."""
    if shutil.which("pyenv"):
        for v in subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split():
            if v == version or v.startswith(version + "."):
                p = subprocess.run(["pyenv", "which", "python"], capture_output=True, text=True,
                                   env={**os.environ, "PYENV_VERSION": v})
                if p.returncode == 0:
                    return p.stdout.strip()
    found = shutil.which(f"python{version}")
    if not found:
        pytest.fail(f"no Python {version} on this machine: the install is tested on it (pyenv install {version})")
    return found


def run(cmd: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None,
        ok: bool = True) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "EROICA_"))}
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**clean, **(env or {})})
    if ok:
        assert p.returncode == 0, f"{cmd}: rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def venv(tmp: Path, version: str) -> Path:
    run([python(version), "-m", "venv", str(tmp)], cwd=tmp.parent)
    return tmp / "bin"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist, and the wheel built from it (what `python -m build` does), metadata checked."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out, timeout=300)
    (whl,), (sdist,) = list(out.glob("eroica-*.whl")), list(out.glob("eroica-*.tar.gz"))
    check = run([sys.executable, "-m", "twine", "check", "--strict", str(whl), str(sdist)], cwd=out)
    assert check.stdout.count("PASSED") == 2, check.stdout
    return {"wheel": whl, "sdist": sdist}


def test_the_wheel_carries_the_knowledge_templates_and_migrations_and_says_what_each_extra_brings(
        dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    for must in ("eroica/knowledge/taxonomy.yaml", "eroica/collector/bootstrap/sitecustomize.py",
                 "eroica/engine/templates/report.html.j2", "eroica/service/migrations/env.py"):
        assert must in names, must
    assert any(n.startswith("eroica/knowledge/rules/") and n.endswith(".yaml") for n in names)
    assert not any(n.startswith(("tests/", "incidents/", "bench/")) for n in names)
    meta = zipfile.ZipFile(dist["wheel"]).read(next(n for n in names if n.endswith("METADATA"))).decode()
    base = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert {re.split(r"[<>=!;\[ ]", ln.split(":", 1)[1].strip())[0].lower() for ln in base} == {
        "pydantic", "numpy", "psutil", "pyyaml", "msgspec"}, base
    assert "Requires-Python: >=3.10" in meta and "License-Expression: Apache-2.0" in meta
    for extra in ("engine", "serve", "assistant", "all", "gpu", "native-stacks"):
        assert f"Provides-Extra: {extra}" in meta, extra
    assert "durable-rules==2.0.28; python_version < \"3.13\" and extra == \"engine\"" in meta


def test_collector_only_on_python_3_13_records_a_window_without_torch_or_the_engine(
        dist: dict[str, Path], tmp_path: Path) -> None:
    bin_ = venv(tmp_path / "venv", "3.13")
    run([str(bin_ / "python"), *PIP, str(dist["wheel"])], cwd=tmp_path, timeout=400)
    have = {ln.split("==")[0].lower() for ln in run([str(bin_ / "python"), "-m", "pip", "freeze"], cwd=tmp_path)
            .stdout.split()}
    assert not have & {"durable-rules", "fastapi", "sqlalchemy", "jinja2", "torch", "libcst", "uvicorn"}, have
    # a plain Python loop watched by the Monitor: a window on demand, as the detector would open one
    p = run([str(bin_ / "python"), str(ROOT / "tests" / "install" / "plain_loop.py"), str(tmp_path / "run")],
            cwd=tmp_path, env={"EROICA_FORCE_WINDOW_AT_STEP": "40"}, timeout=120)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert "w000-s40/rank-0.json" in got["files"], got
    assert got["eroica"] == ["collector", "schema"] and got["heavy"] == [], got
    doc = json.loads((tmp_path / "run" / "w000-s40" / "rank-0.json").read_text())
    assert doc["schema"].startswith("eroica.patterns/") and doc["functions"], sorted(doc)
    # the console script: what is here works, what needs an extra says which and what to do
    eroica = str(bin_ / "eroica")
    assert "Python 3.13" in run([eroica, "--version"], cwd=tmp_path).stdout
    helptext = run([eroica, "--help"], cwd=tmp_path).stdout
    assert "needs Python 3.10-3.12 with eroica[engine]" in " ".join(helptext.split())
    diag = run([eroica, "diagnose", str(tmp_path / "run")], cwd=tmp_path, ok=False)
    assert diag.returncode == 2 and "runs on Python 3.10-3.12" in diag.stderr and "Traceback" not in diag.stderr
    serve = run([eroica, "serve", "--db", str(tmp_path / "db.sqlite")], cwd=tmp_path, ok=False)
    assert serve.returncode == 2 and "runs on Python 3.10-3.12" in serve.stderr, serve.stderr
    assert "pip install 'eroica[serve]'" in serve.stderr
    # [serve] installs on 3.13 (its engine requirement is skipped there), and the service still refuses to
    # start rather than fail every window it is sent
    run([str(bin_ / "python"), *PIP, "--no-deps", "fastapi", "sqlalchemy"], cwd=tmp_path, timeout=300)
    serve = run([eroica, "serve", "--db", str(tmp_path / "db.sqlite")], cwd=tmp_path, ok=False)
    assert serve.returncode == 2 and "runs on Python 3.10-3.12" in serve.stderr, serve.stderr
    assert "recent_steps" in run([eroica, "policy", "show"], cwd=tmp_path).stdout
    att = run([eroica, "run", "--out", str(tmp_path / "attached"), "--", str(bin_ / "python"), "-c",
               "print('the job ran')"], cwd=tmp_path)
    assert "the job ran" in att.stdout


def test_all_on_python_3_11_diagnoses_a_real_two_rank_job_attached_with_eroica_run(
        dist: dict[str, Path], tmp_path: Path) -> None:
    bin_ = venv(tmp_path / "venv", "3.11")
    # as deploy/docker/Dockerfile installs it: every wheel built first (durable-rules has none on PyPI), then
    # installed with no index (the image's second stage has no compiler and no network)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--wheel-dir",
         str(tmp_path / "wheels"), f"eroica[all] @ {dist['wheel'].as_uri()}"], cwd=tmp_path, timeout=600)
    assert list((tmp_path / "wheels").glob("durable_rules-*.whl"))
    run([str(bin_ / "python"), *PIP, "torch==2.13.0"], cwd=tmp_path, timeout=600)       # the job's own torch
    run([str(bin_ / "python"), *PIP, "--no-index", "--find-links", str(tmp_path / "wheels"), "eroica[all]"],
        cwd=tmp_path, timeout=600)
    out = tmp_path / "run"
    job = run([str(bin_ / "eroica"), "run", "--out", str(out), "--", str(bin_ / "python"), "-m",
               "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "train_ddp.py"), "--steps", "110", "--fault", "dataloader_stall",
               "--fault-rank", "1"], cwd=tmp_path, timeout=400)
    assert "window(s) in" in job.stderr, job.stderr[-2000:]
    p = run([str(bin_ / "eroica"), "diagnose", str(out), "--format", "json"], cwd=tmp_path, ok=False, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    d = json.loads(p.stdout)
    found = [(f["root_cause"], f["ranks"], f["confidence"]) for w in d["windows"] for f in w["findings"]]
    assert any(rc == "dataloader_stall" and ranks == [1] and c >= 0.5 for rc, ranks, c in found), found
    assert not [f for f in found if f[2] >= 0.5 and f[:2] != ("dataloader_stall", [1])], found
    # the installed package ran, not the checkout
    where = run([str(bin_ / "python"), "-c", "import eroica.engine, sys; print(eroica.engine.__file__)"], cwd=tmp_path)
    assert str(tmp_path / "venv") in where.stdout


@pytest.mark.parametrize("python_version,arch", [("3.14", "x86_64"), ("3.10", "aarch64")])
def test_the_base_install_is_wheels_only_where_no_interpreter_is_at_hand(
        dist: dict[str, Path], tmp_path: Path, python_version: str, arch: str) -> None:
    """Python 3.14 and ARM hosts are not on this machine: pip resolves the wheel's base requirements for them
    from the registry, binary wheels only (nothing the training image would have to compile)."""
    platforms = [f"--platform=manylinux_{v}_{arch}" for v in ("2_28", "2_17")] + [f"--platform=manylinux2014_{arch}"]
    p = run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
             f"--python-version={python_version}", "--implementation=cp", *platforms, "-d", str(tmp_path / "w"),
             str(dist["wheel"])], cwd=tmp_path, timeout=300)
    got = sorted(f.name.split("-")[0].lower() for f in (tmp_path / "w").glob("*.whl"))
    assert {"eroica", "numpy", "pydantic", "pydantic_core", "psutil", "pyyaml", "msgspec"} <= set(got), (got, p.stderr)
    assert not list((tmp_path / "w").glob("*.tar.gz")), got
