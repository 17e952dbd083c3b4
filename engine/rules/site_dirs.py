"""What a site knowledge directory may hold, checked before anything in it is read, so that nothing in
it is silently skipped: a `rule/` folder for `rules/`, an override file ending in .yml, a `taxonomy.yml`,
a site's own priors.yaml, a rule file beside the folders instead of in `rules/`."""

from __future__ import annotations

import difflib
from pathlib import Path

from eroica.engine.rules.source import builtin_knowledge_dir

PARTS = ("rules", "overrides", "taxonomy.yaml", "hypotheses.yaml")
#: what a copy of knowledge/ or a site's repository also holds, read by other tools or by people
KNOWN = ("incidents", "runbooks", "remediations", "priors.yaml", "README.md", "__init__.py", "py.typed",
         "__pycache__", ".git")


def problems(d: Path, label: str) -> list[str]:
    """Why the site directory `d` (named `label` in messages: where it was given) cannot be read as it is."""
    if not d.is_dir():
        return [f"{label}: not a directory (a site knowledge directory holds rules/, overrides/*.yaml, "
                "taxonomy.yaml and/or hypotheses.yaml)"]
    out = []
    priors = d / "priors.yaml"
    if priors.is_file() and priors.read_bytes() != (builtin_knowledge_dir() / "priors.yaml").read_bytes():
        out.append(f"{label}: priors.yaml is not read from a site (priors are fitted on the shipped rules); set a "
                   "rule's prior at your site in overrides/*.yaml (`confidence:`, with a reason)")
    for entry in sorted(d.iterdir()):
        name = entry.name
        if name in PARTS or name in KNOWN or name.startswith("."):
            continue
        near = difflib.get_close_matches(name.lower(), [*PARTS, *(p.replace(".yaml", ".yml") for p in PARTS[2:])],
                                         n=1, cutoff=0.7)
        if entry.suffix in (".yaml", ".yml") and entry.is_file():
            fix = (f"rename it {Path(name).stem}.yaml" if Path(name).stem in ("taxonomy", "hypotheses")
                   else "a site's rules go in DIR/rules/, its overrides in DIR/overrides/")
            out.append(f"{label}: {name} would never be read: {fix}")
        elif near and entry.is_dir():
            target = near[0] if near[0] in PARTS else near[0].replace(".yml", ".yaml")
            out.append(f"{label}: {name}/ would never be read: did you mean {target}/?")
    rules = d / "rules"
    if rules.is_dir():
        out += [f"{label}: rules/{f.relative_to(rules)} would never be read there: it belongs in {d}/ (one level up)"
                for f in sorted(rules.rglob("*")) if f.name in ("taxonomy.yaml", "hypotheses.yaml", "overrides")]
    out += [f"{label}: {sub.name}/ is a site directory of its own: did you mean --knowledge {sub}?"
            for sub in sorted(d.iterdir()) if sub.is_dir() and sub.name not in PARTS and looks_like_site(sub)]
    ov = d / "overrides"
    if ov.is_dir():
        out += [f"{label}: overrides/{f.name} would never be read: override files end in .yaml; rename it"
                for f in sorted(ov.iterdir()) if f.suffix.lower() in (".yml", ".yaml") and f.suffix != ".yaml"]
    return out


def looks_like_site(p: Path) -> bool:
    """A folder given where rule files are expected that is a site directory (its rules/ and taxonomy)."""
    return p.is_dir() and any((p / part).exists() for part in ("rules", "overrides", "taxonomy.yaml"))
