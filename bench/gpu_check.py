"""The GPU path on a real GPU, in one prepared run (for a session lent a device machine).

Three short single-GPU training loops with the Monitor attached and a window forced after warm-up:
1. `healthy`: host batches copied from pageable memory each step;
2. `pinned`: the same batches from pinned memory (the copies' names and speed change);
3. `contended`: a second process runs matmuls on the same GPU all the while.
For each it checks that NVML fields arrive (clocks, power, PCIe, utilization, throttle reasons),
that CUDA kernels and memcpy land in the pattern document, and prints the signature the window
recorded (kernel seconds per step, SM clock, GPU utilization, memcpy seconds), so the contended and
pageable cases can be compared with the healthy one. Writes `gpu_check.json` to OUT (or --out).

    python bench/gpu_check.py --out $OUT          # on the GPU machine
    python bench/gpu_check.py --cpu --out /tmp/g  # the same harness on CPU (no NVML, no kernels)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HOG = r"""
import pathlib, sys, time, torch
a = torch.randn(8192, 8192, device="cuda"); b = torch.randn(8192, 8192, device="cuda")
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    (a @ b).sum().item()
    pathlib.Path(sys.argv[2]).touch()    # running
"""


def loop(out: Path, case: str, device: str, steps: int) -> dict[str, object]:
    import torch

    from eroica.collector import Monitor, TriggerPolicy
    from eroica.schema.patterns import Category, PatternsDoc

    os.environ["EROICA_FORCE_WINDOW_AT_STEP"] = "15"
    run = out / case
    mon = Monitor(out_dir=run, policy=TriggerPolicy(window_steps=10), rank=0, world_size=1)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())])
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host = torch.randn(256, 2048)
    if case == "pinned" and device == "cuda":
        host = host.pin_memory()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        x = host.to(device, non_blocking=case == "pinned")
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        mon.step()
        times.append(time.perf_counter() - t)
    mon.close()
    files = list(run.glob("w000-s15/rank-0.json"))
    if not files:
        return {"case": case, "ok": False, "why": f"no pattern file; gaps: {[g.reason for g in mon.gaps]}"}
    doc = PatternsDoc.model_validate_json(files[0].read_text())
    n = len(doc.step_times.during_seconds)
    by_cat: dict[str, float] = {}
    for f in doc.functions:
        by_cat[f.category.value] = by_cat.get(f.category.value, 0.0) + f.critical_seconds / n
    kernels = sorted((f for f in doc.functions if f.category == Category.kernel), key=lambda f: -f.critical_seconds)
    copies = [f.name for f in doc.functions if f.category == Category.memory]
    gpu = doc.hardware.gpu
    checks = {
        "nvml_fields": all(k in gpu for k in ("gpu_sm_clock_mhz", "gpu_power_w", "gpu_util_ratio", "gpu_pcie_width")),
        "kernels_in_patterns": bool(kernels),
        "memcpy_in_patterns": bool(copies),
        "pageable_named": case != "healthy" or any("Pageable" in c for c in copies),
        "pinned_named": case != "pinned" or any("Pinned" in c for c in copies),
    }
    return {"case": case, "ok": all(checks.values()) if device == "cuda" else True, "checks": checks,
            "step_seconds_median": sorted(times[15:25])[5], "seconds_per_step_by_category": by_cat,
            "top_kernels": [(k.name, round(k.critical_seconds / n, 6), k.metric_mean) for k in kernels[:5]],
            "copies": copies, "gpu": gpu, "gaps": [f"{g.source}: {g.reason}" for g in doc.gaps],
            "pattern_bytes": doc.overhead.pattern_bytes}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    p.add_argument("--cpu", action="store_true", help="run the harness on CPU (no GPU checks)")
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu to exercise the harness only")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = [loop(args.out, "healthy", device, args.steps), loop(args.out, "pinned", device, args.steps)]
    if device == "cuda":
        ready = args.out / "hog.running"
        hog = subprocess.Popen([sys.executable, "-c", HOG, "120", str(ready)])
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline and hog.poll() is None:
                time.sleep(0.2)           # until the co-located workload runs its products
            results.append(loop(args.out, "contended", device, args.steps))
        finally:
            hog.kill()
            hog.wait()
    for r in results:
        print(json.dumps({k: r.get(k) for k in ("case", "ok", "checks", "step_seconds_median",
                                                "seconds_per_step_by_category", "top_kernels")}))
    (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
