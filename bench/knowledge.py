"""What the one compile path costs, as ratios in one run: building the shipped knowledge through
`eroica.engine.rules.layers.load` (layers, overrides, priors, compile, the vocabulary and the checks
that refuse a rule that can never fire) against the plain load and compile it replaced
(`load_rules` + `compile_rules`, no layers, no checks), and against reading the compiled rules from
the rule cache (what a diagnosis pays when no knowledge file changed). Rounds alternate the three, in
one process after a warm-up, so that imports and machine noise weigh on each alike.

    .venv/bin/python bench/knowledge.py [--rounds 15] [--site DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--site", type=Path, default=None, help="a site knowledge directory to layer over the shipped")
    args = p.parse_args()
    os.environ["EROICA_CACHE_DIR"] = tempfile.mkdtemp(prefix="eroica-bench-cache-")
    from eroica.engine import KnowledgeSpec, compiled, load_priors
    from eroica.engine import load_knowledge as load
    from eroica.engine.rules import builtin_knowledge_dir, compile_rules, load_rules

    spec = KnowledgeSpec(site_dirs=(args.site,) if args.site else ())
    priors = load_priors(builtin_knowledge_dir())

    def plain() -> int:
        return len(compile_rules(load_rules(None, None, priors)))

    def layered() -> int:
        return len(load(spec).irs)

    def cached() -> int:
        return len(compiled(spec))

    modes = {"plain load+compile": plain, "layers.load (checked)": layered, "from the rule cache": cached}
    for f in modes.values():                 # warm-up: imports, the hypothesis models, the cache entry
        f()
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m, f in modes.items():
            t = time.perf_counter()
            f()
            times[m].append(time.perf_counter() - t)
    base = statistics.median(times["plain load+compile"])
    print(f"{len(load(spec).irs)} rules; median of {args.rounds} rounds, ratio to the plain load+compile")
    for m, ts in times.items():
        med = statistics.median(ts)
        print(f"  {m:<24} {med * 1000:8.1f} ms  x{med / base:.2f}  "
              f"(min {min(ts) * 1000:.1f}, max {max(ts) * 1000:.1f})")


if __name__ == "__main__":
    main()
