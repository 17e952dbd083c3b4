"""What the service tests share: the token, and real pattern documents of the incident library."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def incident_docs(inc: str = "INC-0017") -> list[bytes]:
    """The rank documents of an incident's first window, as the collector wrote them."""
    wdir = sorted(p for p in (ROOT / "incidents" / inc / "patterns").iterdir() if p.is_dir())[0]
    files = sorted(wdir.glob("rank-*.json"))
    if files:
        return [f.read_bytes() for f in files]
    return [ln for p in sorted(wdir.glob("pack-*.jsonl")) for ln in p.read_bytes().splitlines() if ln.strip()]
