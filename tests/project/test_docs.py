"""The front door stays true: every relative link of the README and docs/ reaches a file (and, with
an anchor, a heading of it), the README stays a front door (short, no measurements), and every
`docs/` page is reachable from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    bad = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif frag and dest.suffix == ".md":
                heads = {anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                if frag not in heads:
                    bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert bad == [], bad


def test_the_readme_is_a_front_door_linking_every_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated measurements belong in docs/benchmarks.md"
    assert not re.search(r"\b[Ii]ssue \d+", text)
    linked = {Path(t).name for t in LINK.findall(text)}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked
