"""The well-kept detector: Yelp's detect-secrets (its plugins and filters, at their defaults) finds the
secret values in what is about to be sent to a model. It reads files, so the text is written to a
private temporary directory and scanned as Python (its keyword plugin's quoted assignments) and as YAML
(`key: value` and `key=value` forms). This is the only module that imports detect_secrets; eroica's own
rules (assistant/redact.py) add the forms it does not know (headers, .netrc lines, command-line flags,
hosts, paths, addresses)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from detect_secrets.core.scan import scan_file
from detect_secrets.settings import default_settings

MIN_CHARS = 4           # a shorter value is not replaced wherever it appears (it would hit code, not a secret)


def secret_values(text: str) -> list[str]:
    """Every value detect-secrets reports in `text`, longest first."""
    found: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="eroica-scan-") as tmp, default_settings():
        for name in ("prompt.py", "prompt.yaml"):
            path = Path(tmp) / name
            path.write_text(text)
            found.update(s.secret_value for s in scan_file(str(path)) if s.secret_value)
    return sorted((v for v in found if len(v) >= MIN_CHARS and v in text), key=len, reverse=True)
