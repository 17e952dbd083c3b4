"""Records what NVML reports for one real GPU, idle and under a matrix-product load, in the sample
format `collector.nvml.ReplayNvml` replays (tests on machines without a GPU read the recording through
the same source class the live collector uses).

    python bench/nvml_record.py --out $OUT/nvml_record.json     # on a machine with a GPU

Every column `NvmlSource` could read is kept; the fields this driver refused are listed with NVML's
reason, and the NVLink states and error counters are recorded when the GPU has links.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any


def nvlink(n: Any, handle: Any) -> dict[str, list[int]]:
    states, errors = [], []
    for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            states.append(int(n.nvmlDeviceGetNvLinkState(handle, link)))
        except Exception:
            break
        try:
            errors.append(sum(int(n.nvmlDeviceGetNvLinkErrorCounter(handle, link, c)) for c in range(4)))
        except Exception:
            errors.append(0)
    return {"nvlink_states": states, "nvlink_errors": errors} if states else {}


def load(a: Any, b: Any, running: threading.Event, stop: threading.Event) -> None:
    while not stop.is_set():
        (a @ b).sum().item()
        running.set()


def main() -> int:
    import pynvml
    import torch

    from eroica.collector.nvml import NvmlSource

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--idle-seconds", type=float, default=2.0)
    p.add_argument("--load-seconds", type=float, default=4.0)
    p.add_argument("--period-seconds", type=float, default=0.05)
    args = p.parse_args()
    src = NvmlSource(pynvml, 0)
    name = pynvml.nvmlDeviceGetName(src.handle)
    samples: list[dict[str, Any]] = []

    def record(phase: str, seconds: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            row: dict[str, Any] = dict(zip(src.columns, src.read()))
            row.update(nvlink(pynvml, src.handle))
            row["phase"] = phase
            samples.append(row)
            time.sleep(args.period_seconds)

    a = torch.randn(8192, 8192, device="cuda")     # the CUDA context exists before the idle phase
    b = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    time.sleep(1.0)
    record("idle", args.idle_seconds)
    running, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=load, args=(a, b, running, stop), daemon=True)
    worker.start()
    running.wait(30)                      # the first product is done: the load is on
    record("matmul", args.load_seconds)
    stop.set()
    worker.join()
    doc = {"gpu": name if isinstance(name, str) else name.decode(),
           "driver": str(pynvml.nvmlSystemGetDriverVersion()),
           "nvml_version": str(pynvml.nvmlSystemGetNVMLVersion()),
           "period_seconds": args.period_seconds, "unavailable": src.unavailable, "samples": samples}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=0))
    by = {ph: [s for s in samples if s["phase"] == ph] for ph in ("idle", "matmul")}
    for ph, rows in by.items():
        sm = sorted(r.get("gpu_sm_clock_mhz", 0) for r in rows)
        pw = sorted(r.get("gpu_power_w", 0) for r in rows)
        masks = sorted({int(r.get("gpu_throttle_mask", 0)) for r in rows})
        print(f"{ph}: {len(rows)} samples, SM clock median {sm[len(sm) // 2]:.0f} MHz, "
              f"power median {pw[len(pw) // 2]:.0f} W, throttle masks {masks}")
    print(f"unavailable: {src.unavailable}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
