"""A job's k-th window through the service's worker: its documents and the k-1 earlier windows'
history summaries (now), against the way before (the k-1 earlier windows' documents diagnosed
again with it), in one run. Usage: python bench/history.py"""

from __future__ import annotations

import time
from pathlib import Path

from eroica.engine import DiagnoseOptions, diagnose_documents, window_of_packs
from eroica.schema.diagnosis import Diagnosis
from eroica.service.worker import diagnose_window

ROOT = Path(__file__).parents[1] / "incidents" / "INC-0017" / "patterns"
wdir = sorted(p for p in ROOT.iterdir() if p.is_dir())[0]
docs = [f.read_bytes() for f in sorted(wdir.glob("rank-*.json"))]
d = Diagnosis.model_validate_json(diagnose_window("w000-s10", docs, None, [], []))
h = d.windows[0].history.model_dump_json()  # type: ignore[union-attr]
diagnose_window("w000-s10", docs, None, [], [])   # warm
for k in (1, 10, 50):
    t0 = time.perf_counter()
    diagnose_window(f"w{k:03d}-s{10*k}", docs, None, [h] * (k - 1), [])
    now = time.perf_counter() - t0
    t0 = time.perf_counter()
    wins = [window_of_packs(f"w{i:06d}-s0", docs) for i in range(k)]
    diagnose_documents(wins, opts=DiagnoseOptions(in_process=True))
    old = time.perf_counter() - t0
    print(f"window {k}: {now * 1000:.0f} ms with {k - 1} summaries; {old * 1000:.0f} ms re-diagnosing its {k} "
          "windows' documents")
