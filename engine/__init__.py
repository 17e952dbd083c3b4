"""eroica.engine: peer comparison, facts and the forward-chaining rule base over pattern files."""

#: eroica's version, as pyproject.toml says (tests/unit/engine/test_rule_cache.py checks they agree);
#: a constant, because reading the installed metadata costs more than a small diagnosis
VERSION = "0.1.0"

#: the report formats (engine/render.py); here, so the CLI's argument parser needs no engine import
FORMATS = ("text", "json", "md", "html")
