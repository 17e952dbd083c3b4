"""eroica.knowledge: data SREs author (taxonomy, one YAML rule per file, runbooks). No code."""
