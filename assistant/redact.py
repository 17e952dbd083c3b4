"""What leaves the machine: before a prompt is sent to a model endpoint, everything that could name
the site is replaced by a placeholder: cloud object URIs, URLs (but a short list of public
documentation hosts), absolute paths of any root (POSIX, home-relative and Windows), the components
of relative paths (a customer's name in `data/acme_corp/train.jsonl`) but for a short list of
common words, every fully qualified host name not on a short allow-list (`prodbox3.example.com`),
hostnames that look like cluster nodes or internal domains, IPv4 and IPv6 addresses, e-mails,
values assigned to secret-like names (`DB_PASSWORD = "Tr0ub4dor&3"`, `api_key = "hunter2hunter2"`),
tokens by their well-known prefixes and any long high-entropy string, UUIDs and long hex ids, plus
the diagnosis's own hostnames, the site's patterns (`--redact REGEX`, `--redact-file FILE` or
`EROICA_REDACT_FILE`: one regular expression per line, `#` comments). Only the code around the
located target is sent."""

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
SECRET_NAME = (r"(?:[A-Za-z_][\w.-]*?)?(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
               r"private[_-]?key|credentials?|auth[_-]?key|client[_-]?secret|signing[_-]?key)[\w-]*")
# NAME = "value" (any name that says secret, any quoted value), and env-style NAME=value for UPPER names
SECRET_ASSIGN = re.compile(r"(?i)\b(" + SECRET_NAME + r")([\"']?\s*(?::|=|:=)\s*)([\"'])((?:(?!\3)[^\\\n]|\\.)+)\3")
SECRET_YAML = re.compile(r"(?im)^(\s*(?:- )?" + SECRET_NAME + r")(\s*:\s+)([^\s\"'#{\[][^\s#]*)[ \t]*$")
SECRET_ENV = re.compile(r"\b((?=[A-Z0-9_]*[A-Z])[A-Z0-9_]*(?:PASS(?:WORD|WD)?|PWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|"
                        r"PRIVATE_?KEY|CREDENTIALS?)[A-Z0-9_]*)(\s*[:=]\s*)([^\s\"'`,;()\[\]{}<>]+)(?=\s|$|[,;])")
# public host names a prompt may name; anything else that is a fully qualified name is the site's
ALLOWED_HOSTS = ("pytorch.org", "python.org", "github.com", "githubusercontent.com", "huggingface.co", "pypi.org",
                 "readthedocs.io", "nvidia.com")                 # and their subdomains
ALLOWED_EXACT = ("example.com", "example.org", "example.net")   # the names themselves, not hosts under them
TLDS = ("com", "net", "org", "edu", "gov", "mil", "io", "ai", "co", "dev", "app", "cloud", "biz", "info", "tech",
        "xyz", "site", "online", "systems", "services", "solutions", "network", "us", "uk", "de", "fr", "jp", "cn",
        "ru", "br", "au", "ca", "nl", "se", "ch", "kr", "eu", "es", "it", "sg", "tw", "hk", "il", "no", "fi", "dk",
        "be", "at", "ie", "nz", "za", "mx", "ar", "pl", "cz", "us")
FQDN = re.compile(r"(?i)(?<![\w.@/<-])((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:" + "|".join(TLDS) +
                  r"))(?![\w-]|\.\w|\()(?::\d+)?")
# a relative path (two or more components, or one ending in a file extension): each component but
# common words is the site's (customers, teams, projects)
REL_PATH = re.compile(r"(?<![\w/<>.@:-])(?:\.{1,2}/)?(?:[\w.-]+/)+[\w.-]+(?![\w(/])")
PATH_WORDS = {"data", "dataset", "datasets", "train", "training", "val", "valid", "validation", "test", "tests",
              "eval", "src", "lib", "scripts", "configs", "config", "conf", "checkpoints", "checkpoint", "ckpt",
              "ckpts", "logs", "log", "outputs", "output", "out", "models", "model", "runs", "run", "shards", "tmp",
              "cache", "results", "raw", "processed", "images", "text", "tokenizer", "weights", "latest", "best",
              "last", "final", "part", "shard", "index", ".", ".."}
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
        text = self._secret_values(text)
        for rx, ph in PATTERNS[:4]:                            # tokens, URIs, URLs, e-mails
            text = self._sub(rx, ph, text)
        text = self._sub_if(IPV6, "<ip>", text, _ipv6)
        text = self._hosts(text)
        for rx, ph in PATTERNS[4:]:
            text = self._sub(rx, ph, text)
        text = self._relative_paths(text)
        return self._sub_if(CANDIDATE, "<secret>", text, looks_secret)

    def _secret_values(self, text: str) -> str:
        """The value of an assignment to a secret-like name, whatever it looks like."""
        def quoted(m: re.Match[str]) -> str:
            if m.group(4).startswith(("<", "[")):         # a placeholder, or a tokenizer's "</s>", "[PAD]"
                return m.group(0)
            return f"{m.group(1)}{m.group(2)}{m.group(3)}<secret>{m.group(3)}"

        def bare(m: re.Match[str]) -> str:
            return f"{m.group(1)}{m.group(2)}<secret>"
        text = self._replace(SECRET_ASSIGN, "<secret>", text, quoted)
        text = self._replace(SECRET_ENV, "<secret>", text, bare)
        return self._replace(SECRET_YAML, "<secret>", text, bare)

    def _hosts(self, text: str) -> str:
        """Every fully qualified name but the allowed public ones and module paths (`import a.io`)."""
        def one(m: re.Match[str]) -> str:
            name = m.group(1).lower()
            before = text[text.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
            public = name in ALLOWED_EXACT or any(name == h or name.endswith("." + h) for h in ALLOWED_HOSTS)
            return m.group(0) if public or before.startswith(("import ", "from ")) else "<host>"
        return self._replace(FQDN, "<host>", text, one)

    def _relative_paths(self, text: str) -> str:
        """Each component of a relative path but common words; the file's extension stays."""
        def one(m: re.Match[str]) -> str:
            parts = m.group(0).split("/")
            if len(parts) < 3 and not re.search(r"\.[A-Za-z][A-Za-z0-9]{0,7}$", parts[-1]):
                return m.group(0)                             # `a/b`: a division more likely than a path
            out = []
            for p in parts:
                stem, dot, ext = p.partition(".") if not p.startswith(".") else (p, "", "")
                keep = p.lower() in PATH_WORDS or stem.lower() in PATH_WORDS or p.startswith("<") and p.endswith(">")
                if keep or re.fullmatch(r"[0-9_-]*", stem):    # part-0001.parquet: numbers name nobody
                    out.append(p)
                else:
                    out.append("<path>" + (dot + ext if dot else ""))
            return "/".join(out)
        return self._replace(REL_PATH, "<path>", text, one)

    def _replace(self, rx: re.Pattern[str], ph: str, text: str, fn: Callable[[re.Match[str]], str]) -> str:
        """`rx`'s matches through `fn`, counting those it changed under `ph`."""
        n = 0

        def one(m: re.Match[str]) -> str:
            nonlocal n
            out = fn(m)
            n += out != m.group(0)
            return out
        text = rx.sub(one, text)
        self._count(ph, n)
        return text

    def _sub_if(self, rx: re.Pattern[str], ph: str, text: str, test: Callable[[str], bool]) -> str:
        return self._replace(rx, ph, text, lambda m: ph if test(m.group(1) if rx.groups else m.group(0))
                             else m.group(0))

    def _sub(self, rx: re.Pattern[str], ph: str, text: str) -> str:
        text, n = rx.subn(ph, text)
        self._count(ph, n)
        return text

    def _count(self, ph: str, n: int) -> None:
        if n:
            self.replaced[ph] = self.replaced.get(ph, 0) + n
