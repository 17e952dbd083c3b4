"""What each install costs: the wheel built once and installed into clean venvs (collector only on Python 3.13
and 3.11, `[all]` on 3.11), each venv's installed size, and the import time of the collector's Monitor in each
(median of 7 fresh interpreters), against `[all]`'s engine and service stack.

    python bench/install.py [--keep DIR]        # DIR keeps the venvs between runs

Printed as a table for docs/benchmarks.md ("Installs")."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
IMPORTS = {
    "collector (Monitor)": "import eroica.collector.monitor",
    "engine + service": "import eroica.engine.pipeline, eroica.service.app",
}


def pyenv(version: str) -> str:
    out = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
    v = next(x for x in out if x == version or x.startswith(version + "."))
    return subprocess.run(["pyenv", "which", "python"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYENV_VERSION": v}).stdout.strip()


def size_mb(venv: Path) -> float:
    total = sum(f.stat().st_size for f in (venv / "lib").rglob("*") if f.is_file() and not f.is_symlink())
    return total / 1e6


def import_seconds(venv: Path, stmt: str, n: int = 7) -> float | None:
    py = str(venv / "bin" / "python")
    if subprocess.run([py, "-c", stmt], capture_output=True, cwd="/").returncode != 0:
        return None
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([py, "-c", stmt], check=True, capture_output=True, cwd="/")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="keep the venvs here (reused when present)")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="eroica-bench-install-"))
    base.mkdir(parents=True, exist_ok=True)
    dist = base / "dist"
    if not list(dist.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)], check=True,
                       capture_output=True)
    (whl,) = dist.glob("*.whl")
    envs = {"collector only, 3.13": ("3.13", str(whl)), "collector only, 3.11": ("3.11", str(whl)),
            "[all], 3.11": ("3.11", f"eroica[all] @ {whl.as_uri()}")}
    rows = []
    floor = {}
    for version in {v for v, _ in envs.values()}:       # a bare venv: pip (and setuptools) themselves
        empty = base / f"empty-{version}"
        if not empty.exists():
            subprocess.run([pyenv(version), "-m", "venv", str(empty)], check=True)
        floor[version] = size_mb(empty)
    for name, (version, req) in envs.items():
        venv = base / name.replace(" ", "-").replace(",", "").replace("[", "").replace("]", "")
        if not venv.exists():
            subprocess.run([pyenv(version), "-m", "venv", str(venv)], check=True)
            t0 = time.perf_counter()
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", req],
                           check=True)
            print(f"{name}: installed in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        rows.append((name, size_mb(venv) - floor[version], {k: import_seconds(venv, v) for k, v in IMPORTS.items()}))
    print(f"\nwheel {whl.name}; sizes exclude a bare venv's own (pip, setuptools); import: median of 7 "
          "interpreters, each a fresh process\n")
    print("| install | installed size | import the collector's Monitor | import the engine and the service |")
    print("|---|---|---|---|")
    for name, mb, t in rows:
        cells = [f"{t[k] * 1000:.0f} ms" if t[k] is not None else "not installed" for k in IMPORTS]
        print(f"| {name} | {mb:.0f} MB | {cells[0]} | {cells[1]} |")
    print(f"\nvenvs in {base}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
