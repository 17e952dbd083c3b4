"""What leaves the machine: before a prompt is sent to a model endpoint, everything that could name
the site is replaced by a placeholder: cloud object URIs, URLs (but a short list of public
documentation hosts), absolute paths of any root (POSIX, home-relative and Windows), hostnames that
look like cluster nodes or internal domains, IPv4 and IPv6 addresses, e-mails, tokens by their
well-known prefixes and any long high-entropy string, UUIDs and long hex ids, plus the diagnosis's
own hostnames, the site's patterns (`--redact REGEX`, `--redact-file FILE` or `EROICA_REDACT_FILE`:
one regular expression per line, `#` comments). Only the code around the located target is sent."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eroica.assistant.errors import DraftInputError

PUBLIC_HOSTS = ("pytorch.org", "docs.python.org", "github.com/pytorch", "huggingface.co/docs", "peps.python.org")
_START = r"""(?<![^\s"'=(\[,{`<>])"""          # a path starts a word: not after `)`, a letter or a digit
TOKEN_PREFIXES = (r"hf_[A-Za-z0-9]{16,}", r"gh[pousr]_[A-Za-z0-9]{16,}", r"github_pat_[A-Za-z0-9_]{20,}",
                  r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", r"(?:AKIA|ASIA|AIDA|AROA)[0-9A-Z]{16}",
                  r"xox[abposr]-[A-Za-z0-9-]{10,}", r"glpat-[A-Za-z0-9_-]{16,}", r"AIza[0-9A-Za-z_-]{30,}",
                  r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", r"npm_[A-Za-z0-9]{30,}",
                  r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")
CLUSTER_WORDS = ("node", "gpu", "worker", "compute", "host", "dgx", "h100", "h200", "a100", "b200", "gb200", "trn",
                 "tpu", "ip", "cn", "gn", "nid", "rack", "srv", "server", "slurm", "hpc", "login", "train", "kube",
                 "k8s", "pod", "master", "head", "ml", "hgx")
INTERNAL_TLDS = ("internal", "local", "localdomain", "corp", "lan", "cluster", "svc", "intra", "intranet", "prod",
                 "priv", "private", "home", "int", "ec2", "compute")

PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile("|".join(TOKEN_PREFIXES)), "<token>"),
    (re.compile(r"\b(?:s3a?|gs|gcs|az|abfss?|wasbs?|adl|hdfs|oss|cos|r2|swift|webhdfs|file|dbfs|lakefs|minio)"
                r"://[^\s\"'`)<>]*", re.IGNORECASE), "<uri>"),
    (re.compile(r"\b(?:https?|wss?|ftp|sftp|ssh|git|grpc|postgres(?:ql)?|mysql|redis|mongodb(?:\+srv)?|amqp)"
                r"://(?!(?:www\.)?(?:" + "|".join(re.escape(h) for h in PUBLIC_HOSTS) + r")[/\s\"'`)]|$)"
                r"[^\s\"'`)<>]+", re.IGNORECASE), "<url>"),
    (re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), "<uuid>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<ip>"),
    (re.compile(r"\b[\w-]+(?:\.[\w-]+)*\.(?:" + "|".join(INTERNAL_TLDS) + r")\b(?::\d+)?", re.IGNORECASE), "<host>"),
    (re.compile(r"\b(?:[a-z][a-z0-9]*[-_])*(?:" + "|".join(CLUSTER_WORDS) + r")[-_]?\d+(?:[-_.][a-z0-9]+)*\b",
                re.IGNORECASE), "<host>"),
    (re.compile(_START + r"(?:~|\$HOME|\$\{HOME\})?/(?![/\s])[^\s\"'`,;)\]}<>|]*"), "<path>"),
    (re.compile(r"\b[A-Za-z]:\\[^\s\"'`,;)<>|]+|\\\\[\w.-]+\\[^\s\"'`,;)<>|]+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{24,}\b", re.IGNORECASE), "<id>"),
)
IPV6 = re.compile(r"(?<![\w:.])\[?([0-9A-Fa-f:]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*)(%[\w.]+)?\]?(?::\d+)?(?![\w:])")
CANDIDATE = re.compile(r"[A-Za-z0-9+/=_-]{20,}")
ENTROPY_BITS_PER_CHAR = 3.5


def entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _ipv6(s: str) -> bool:
    """An IPv6 address with at least three groups (so a slice `x[::2]` or `a::b` stays code)."""
    if sum(1 for g in s.split(":") if g) < 3 and "." not in s:
        return False
    try:
        ipaddress.IPv6Address(s)
        return True
    except ValueError:
        return False


def looks_secret(s: str) -> bool:
    """A long string that mixes letters and digits with high entropy (a key, not an identifier)."""
    letters, digits = sum(ch.isalpha() for ch in s), sum(ch.isdigit() for ch in s)
    if not letters or digits < 2 or s.lower() == s and "_" in s and digits < 4:
        return False
    return entropy(s) >= ENTROPY_BITS_PER_CHAR


def load_pattern_file(path: Path) -> list[str]:
    """One regular expression per line; blank lines and `#` comments ignored; a bad one is an error
    that names the file and line."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DraftInputError(f"{path}: cannot read the redaction patterns: {exc}") from exc
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            re.compile(line)
        except re.error as exc:
            raise DraftInputError(f"{path}:{i}: not a regular expression ({exc}): {line!r}") from exc
        out.append(line)
    return out


@dataclass
class Redactor:
    hostnames: list[str] = field(default_factory=list)       # from the diagnosis: never sent
    extra: list[str] = field(default_factory=list)           # the site's own regular expressions
    replaced: dict[str, int] = field(default_factory=dict)   # placeholder -> count, for the record

    @classmethod
    def for_site(cls, hostnames: list[str], extra: list[str] | None = None, pattern_file: Path | None = None
                 ) -> Redactor:
        pats = list(extra or [])
        env = os.environ.get("EROICA_REDACT_FILE")
        for path in (pattern_file, Path(env) if env else None):
            if path is not None:
                pats += load_pattern_file(path)
        for pat in pats:
            try:
                re.compile(pat)
            except re.error as exc:
                raise DraftInputError(f"--redact {pat!r}: not a regular expression ({exc})") from exc
        return cls(hostnames=hostnames, extra=pats)

    def __call__(self, text: str) -> str:
        for pat in self.extra:                                  # the site's first: its word wins
            text = self._sub(re.compile(pat), "<redacted>", text)
        for host in sorted({h for h in self.hostnames if h and h != "-"}, key=len, reverse=True):
            text = self._sub(re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w-])"), "<host>", text)
        for rx, ph in PATTERNS[:4]:                            # tokens, URIs, URLs, e-mails
            text = self._sub(rx, ph, text)
        text = self._sub_if(IPV6, "<ip>", text, _ipv6)
        for rx, ph in PATTERNS[4:]:
            text = self._sub(rx, ph, text)
        return self._sub_if(CANDIDATE, "<secret>", text, looks_secret)

    def _sub_if(self, rx: re.Pattern[str], ph: str, text: str, test: Callable[[str], bool]) -> str:
        n = 0

        def one(m: re.Match[str]) -> str:
            nonlocal n
            if test(m.group(1) if rx.groups else m.group(0)):
                n += 1
                return ph
            return m.group(0)
        text = rx.sub(one, text)
        self._count(ph, n)
        return text

    def _sub(self, rx: re.Pattern[str], ph: str, text: str) -> str:
        text, n = rx.subn(ph, text)
        self._count(ph, n)
        return text

    def _count(self, ph: str, n: int) -> None:
        if n:
            self.replaced[ph] = self.replaced.get(ph, 0) + n
