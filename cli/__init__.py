"""eroica.cli: the `eroica` command (demo, diagnose, rules)."""
