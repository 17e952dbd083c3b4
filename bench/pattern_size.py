"""Pattern bytes per rank per window, over recorded incidents or any run directories.

    .venv/bin/python bench/pattern_size.py [RUN_OR_INCIDENT_DIRS...]   (default: incidents/*/patterns)
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median


def main() -> int:
    roots = [Path(a) for a in sys.argv[1:]] or sorted(Path("incidents").glob("*/patterns"))
    sizes = [f.stat().st_size for r in roots for f in r.rglob("rank-*.json")]
    if not sizes:
        print("no pattern files found")
        return 1
    print(f"{len(sizes)} pattern files in {len(roots)} run(s): median {median(sizes)} B, "
          f"min {min(sizes)} B, max {max(sizes)} B per rank per window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
