"""A TRANSFORMED copy of real multi-rank Kineto traces: some ranks' host launches delayed.

Generalization case 5: ranks whose host issues kernels late leave their device idle between
launches, and their peers wait for them in NCCL. No GPU here, so the shared real traces are
rewritten, and the output files say so in their names (`*.delayed-launches.json.gz`) and in
their metadata (`eroicaTransform`):

- on a delayed rank every kernel launch call (`cudaLaunchKernel`, ...) takes `delay_us` longer,
  and everything after it on that rank (host and device) starts that much later; its collectives
  keep their duration (it arrives last: the others wait for it);
- on every other rank, the k-th NCCL kernel lasts as much longer as the delayed ranks had fallen
  behind by their k-th NCCL kernel (it waits for them), and what follows it shifts by the same;
- each rank's `ProfilerStep#N` stretches to cover its events.
"""

from __future__ import annotations

import bisect
import gzip
import json
from pathlib import Path
from typing import Any

LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")


def _is_nccl(e: dict[str, Any]) -> bool:
    return e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
        return json.load(fh)


def _delay_rank(trace: dict[str, Any], delay_us: float) -> list[float]:
    """Delay every launch on this rank; returns its accumulated delay at each NCCL kernel (in order)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    launches = sorted(float(e["ts"]) for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in LAUNCH)

    def shift(t: float) -> float:            # delay accumulated by launches that began before t
        return delay_us * bisect.bisect_left(launches, t)

    for e in events:
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            e["ts"] = ts + shift(ts)             # device work starts late, runs as long
            continue
        grow = delay_us if e.get("cat") == "cuda_runtime" and e.get("name") in LAUNCH else 0.0
        e["ts"] = ts + shift(ts)
        e["dur"] = end + shift(end) - e["ts"] + grow
    return [shift(float(e["ts"])) for e in sorted(events, key=lambda e: float(e["ts"])) if _is_nccl(e)]


def _wait_for(trace: dict[str, Any], behind: list[float]) -> None:
    """This rank's k-th NCCL kernel waits until the late ranks have caught up (`behind[k]`)."""
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e),
                    key=lambda e: float(e["ts"]))
    nccl = [e for e in events if _is_nccl(e)]
    marks: list[tuple[float, float]] = []      # (original end of a NCCL kernel, added wait so far)
    added = 0.0
    for k, e in enumerate(nccl):
        extra = max(0.0, (behind[k] if k < len(behind) else added) - added)
        e["dur"] = float(e["dur"]) + extra
        added += extra
        marks.append((float(e["ts"]) + float(e["dur"]) - extra, added))
    ends = [m[0] for m in marks]
    for e in events:
        if _is_nccl(e):
            i = bisect.bisect_left(ends, float(e["ts"]))
            e["ts"] = float(e["ts"]) + (marks[i - 1][1] if i else 0.0)
            continue
        i = bisect.bisect_right(ends, float(e["ts"]))
        before = marks[i - 1][1] if i else 0.0
        e["ts"] = float(e["ts"]) + before
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):    # host spans cover the wait
            j = bisect.bisect_right(ends, float(e["ts"]) - before + float(e.get("dur", 0)))
            e["dur"] = float(e.get("dur", 0)) + (marks[j - 1][1] if j else 0.0) - before


def delay_launches(src: Path, out: Path, ranks: list[int], delay_us: float = 40.0) -> list[Path]:
    """Write a transformed copy of the traces in `src` (one file per rank, `distributedInfo` naming
    the rank) into `out`, the launches of `ranks` delayed by `delay_us` each."""
    traces = {}
    for path in sorted(src.iterdir()):
        t = _load(path)
        traces[int(t["distributedInfo"]["rank"])] = (path, t)
    behind: list[float] = []
    for r in ranks:
        at = _delay_rank(traces[r][1], delay_us)
        behind = [max(a, b) for a, b in zip(at, behind)] if behind else at
    for r, (_, t) in traces.items():
        if r not in ranks:
            _wait_for(t, behind)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r, (path, t) in sorted(traces.items()):
        t["eroicaTransform"] = (f"TRANSFORMED for a test: launches of ranks {ranks} delayed {delay_us} us each "
                                f"(tests/kineto_transform.py); not a recording")
        name = path.name.split(".")[0] + ".delayed-launches.json.gz"
        with gzip.open(out / name, "wt") as fh:
            json.dump(t, fh)
        written.append(out / name)
    return written
