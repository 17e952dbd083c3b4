"""What leaves the machine: before a prompt is sent to a model endpoint, paths, hostnames,
addresses, e-mails and long identifiers are replaced by placeholders (the site's policy can add
patterns), and only the code around the finding's function is included (code.relevant_code)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEFAULT_PATTERNS = (
    (re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<ip>"),
    (re.compile(r"(?<![\w.])/(?:home|Users|root|mnt|data|scratch|var|tmp|opt|srv|work)(?:/[\w.@+-]+)+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{24,}\b", re.IGNORECASE), "<id>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), "<uuid>"),
)


@dataclass
class Redactor:
    hostnames: list[str] = field(default_factory=list)       # from the diagnosis: never sent
    extra: list[str] = field(default_factory=list)           # the site's own regular expressions
    replaced: dict[str, int] = field(default_factory=dict)   # placeholder -> count, for the record

    def __call__(self, text: str) -> str:
        for host in sorted(set(h for h in self.hostnames if h), key=len, reverse=True):
            text, n = re.subn(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<host>", text)
            self._count("<host>", n)
        for rx, ph in DEFAULT_PATTERNS:
            text, n = rx.subn(ph, text)
            self._count(ph, n)
        for pat in self.extra:
            text, n = re.subn(pat, "<redacted>", text)
            self._count("<redacted>", n)
        return text

    def _count(self, ph: str, n: int) -> None:
        if n:
            self.replaced[ph] = self.replaced.get(ph, 0) + n
