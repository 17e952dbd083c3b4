"""A plain Python loop watched by the Monitor, with no torch: what the collector-only install must do on
any Python. Prints what it wrote and which of eroica's packages and heavy dependencies were imported."""

import json
import sys
from pathlib import Path

from eroica.collector import PATTERNS_SCHEMA, Monitor, PatternsDoc, TriggerPolicy  # noqa: F401 (the public names resolve)

out = Path(sys.argv[1])
mon = Monitor(out_dir=out, rank=0, world_size=1)
for _ in range(120):
    with mon.region("work"):
        sum(i * i for i in range(20000))
    mon.step()
mon.close()
print(json.dumps({
    "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
    "eroica": sorted({m.split(".")[1] for m in sys.modules if m.startswith("eroica.")}),
    "heavy": sorted(m for m in ("torch", "durable", "fastapi", "sqlalchemy", "jinja2", "libcst", "openai")
                    if m in sys.modules),
}))
