"""What leaves the machine: before a prompt is sent to a model endpoint, everything that could name
the site is replaced by a placeholder: cloud object URIs, URLs (but a short list of public
documentation hosts), absolute paths of any root (POSIX, home-relative and Windows), the components
of relative paths (a customer's name in `data/acme_corp/train.jsonl`) but for a short list of
common words, every fully qualified host name not on a short allow-list (`prodbox3.example.com`),
hostnames that look like cluster nodes or internal domains, IPv4 and IPv6 addresses, e-mails,
values assigned to secret-like names (`DB_PASSWORD = "Tr0ub4dor&3"`, `api_key = "hunter2hunter2"`),
tokens by their well-known prefixes and any long high-entropy string, UUIDs and long hex ids, every
value detect-secrets' plugins find (assistant/secret_scan.py), credentials in headers (`Bearer ...`),
`.netrc` lines, command-line flags (`--password ...`, `mysql -p...`), query strings (`?token=...`) and
environment defaults (`os.environ.setdefault("HF_TOKEN", "...")`), plus
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
from eroica.assistant.secret_scan import secret_values

PUBLIC_HOSTS = ("pytorch.org", "docs.python.org", "github.com/pytorch", "huggingface.co/docs", "peps.python.org")
_START = r"""(?<![^\s"'=(\[,{`<>])"""          # a path starts a word: not after `)`, a letter or a digit
TOKEN_PREFIXES = (r"hf_[A-Za-z0-9]{16,}", r"gh[pousr]_[A-Za-z0-9]{16,}", r"github_pat_[A-Za-z0-9_]{20,}",
                  r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", r"(?:AKIA|ASIA|AIDA|AROA)[0-9A-Z]{16}",
                  r"xox[abposr]-[A-Za-z0-9-]{10,}", r"glpat-[A-Za-z0-9_-]{16,}", r"AIza[0-9A-Za-z_-]{30,}",
                  r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", r"npm_[A-Za-z0-9]{30,}",
                  r"\b(?:SK|AC)[0-9a-fx]{32}\b",                                 # Twilio's key and account ids
                  r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                  r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|$)")
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
    (re.compile(r"(?<![\w+.-])[a-z][a-z0-9+.-]{1,30}://(?!(?:www\.)?(?:" + "|".join(re.escape(h) for h in PUBLIC_HOSTS)
                + r")[/\s\"'`)]|$)[^\s\"'`)<>]+", re.IGNORECASE), "<url>"),           # any other scheme: tcp://
    (re.compile(r"(?<![\w:/])//[\w-]+(?:\.[\w-]+)+(?::\d+)?(?:/[^\s\"'`)<>]*)?"), "<url>"),  # protocol-relative
    (re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), "<uuid>"),
    (re.compile(r"\b[\w-]+(?:\.[\w-]+)*\.(?:" + "|".join(INTERNAL_TLDS) + r")\b(?::\d+)?", re.IGNORECASE), "<host>"),
    (re.compile(r"\b(?:[a-z][a-z0-9]*[-_])*(?:" + "|".join(CLUSTER_WORDS) + r")[-_]?\d+(?:[-_.][a-z0-9]+)*\b",
                re.IGNORECASE), "<host>"),
    (re.compile(_START + r"(?:~|\$HOME|\$\{HOME\})?/(?![/\s=])[^\s\"'`,;)\]}<>|]*"), "<path>"),
    (re.compile(r"\b[A-Za-z]:\\[^\s\"'`,;)<>|]+|\\\\[\w.-]+\\[^\s\"'`,;)<>|]+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{24,}\b", re.IGNORECASE), "<id>"),
)
SECRET_NAME = (r"(?:[A-Za-z_][\w.-]*?)?(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
               r"private[_-]?key|credentials?|auth[_-]?key|client[_-]?secret|signing[_-]?key)[\w-]*")
# NAME = "value" (any name that says secret, any quoted value), and env-style NAME=value for UPPER names
SECRET_ASSIGN = re.compile(r"(?i)\b(" + SECRET_NAME + r")([\"']?\]?\s*(?::|=|:=)\s*@?)"
                           r"([\"'])((?:(?!\3)[^\\\n]|\\.)+)\3")
# a shell or .env assignment of any case at a line's start: export aws_secret_access_key=...
SECRET_SHELL = re.compile(r"(?im)^(\s*(?:export\s+|set\s+)?(?:[\w.-]*?)(?:pass(?:word|wd)?|pwd|secret|token|"
                          r"api[_-]?key|access[_-]?key|private[_-]?key|credentials?)[\w.-]*=)"
                          r"(?![\"'<])([^\s\"'`;|&]+)")
# a tokenizer's or a parser's marker, not a credential: start_token = "class ", eos_token = "</s>"
TOKENIZER_NAME = re.compile(r"(?i)(?:start|end|pad|bos|eos|unk|sep|cls|mask|special|begin|stop)_tokens?$")
# a secret-named environment variable's value given as a call's next argument: setdefault("HF_TOKEN", "...")
SECRET_ARG = re.compile(r"(?i)([\"']" + SECRET_NAME + r"[\"']\s*,\s*)([\"'])((?:(?!\2)[^\\\n]|\\.)+)\2")
# a credential after its scheme word (headers, logs, curl -H): Bearer/Basic/Token <value>
AUTH_SCHEME = re.compile(r"\b((?:[Bb]earer|BEARER|[Bb]asic|BASIC|[Tt]oken|TOKEN|[Dd]igest|[Aa]pi[Kk]ey|sso-key)\s+)"
                         r"(?=[^\s]*[0-9A-Z])([A-Za-z0-9._~+/=:-]{8,})")   # a credential has a digit or a capital
# .netrc: machine <host> login <user> password <secret>
NETRC = re.compile(r"(?im)^([ \t]*(?:machine|default)\b.*)$")
NETRC_VALUE = re.compile(r"(?i)\b(machine|login|password|account)(\s+)(\S+)")
# a command line's secret flags: --password X, --api-key=X, -p<secret> of the database clients
SECRET_FLAG = re.compile(r"(?i)(--?[\w-]*(?:pass(?:word|wd)?|secret|token|api-?key|access-?key|credentials?)[\w-]*)"
                         r"(\s+|=)(?!-)([^\s\"'`;|&]+)")
CLIENT_PASSWORD = re.compile(r"(?i)\b((?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]*?\s-p)(?!\s)([^\s\"'`;|&]+)")
LOGIN_PASSWORD = re.compile(r"(?i)\b((?:docker|podman|buildah|skopeo|nerdctl|oras|helm\s+registry)\s+login\b[^\n]*?\s"
                            r"(?:-p|--password)(?:\s+|=)|sshpass\s+-p\s*)([^\s\"'`;|&]+)")
# credentials given as a command's positional words: curl -u user:pass, poetry config http-basic.X user pass,
# mc alias set NAME URL KEY SECRET
POSITIONAL = re.compile(r"(?i)(\s(?:-u|--user)\s+[^\s:]+:)([^\s\"'`;|&]+)|"
                        r"(\bpoetry\s+config\s+(?:http-basic|pypi-token)\.\S+\s+)(\S+(?:\s+[^\s-]\S*)?)|"
                        r"(\bmc\s+(?:alias\s+set|config\s+host\s+add)\s+\S+\s+\S+\s+)(\S+\s+\S+)")
# a login call's second string: smtp.login("user", "pass"), ldap3.Connection(server, "cn=..", "pass")
LOGIN_CALL = re.compile(r"\b((?:login|authenticate|Connection|bind|simple_bind_s|connect)\((?:[^()\n]*?,\s*)?"
                        r"([\"'])[^\"'\n]*\2\s*,\s*)([\"'])([^\"'\n]+)\3")
# a cluster's node list (SLURM hostlist expressions) and the variables that name a node
NODELIST = re.compile(r"(?i)\b([a-z][\w-]*)\[(?=[\d,-]*[-,])[\d,-]+\](?:[\w.-]*)")
NODE_VARIABLE = re.compile(r"\b((?:[A-Z_]*_)?(?:NODELIST|NODENAME|HOSTNAME|MASTER_ADDR|SUBMIT_HOST)=)([^\s\"'`;,<]+)")
LINK_LOCAL = re.compile(r"(?i)(?<![\w])fe80:[0-9a-f:]*(?:%[\w.]+)?")
QUERY_SECRET = re.compile(r"(?i)([?&;](?:[\w.-]*(?:token|key|sig|signature|secret|password|passwd|pwd|auth|"
                          r"credential|session)[\w.-]*)=)([^&\s\"'`#<>]+)")
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
ATTRIBUTE_OWNERS = ("self", "cls", "super", "args", "cfg", "config", "opt", "opts", "ctx", "model", "module", "np",
                    "torch", "nn", "os", "sys", "math", "trainer", "state", "batch", "loader", "data")
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
IPV4 = re.compile(r"\b((?:\d{1,3}\.){3}\d{1,3})(?::\d+)?\b")
IPV6 = re.compile(r"(?<![\w:.])\[?([0-9A-Fa-f:]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*(?:%[\w.]+)?)\]?(?::\d+)?(?![\w:])")
CANDIDATE = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")   # `=` only as base64's padding: `buffer_size=1048576` is code
ENTROPY_BITS_PER_CHAR = 3.5


def entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _ipv6(s: str) -> bool:
    """An IPv6 address with at least three groups (so a slice `x[::2]` or `a::b` stays code), or with a zone
    (`fe80::1%eth0`)."""
    s, zone, _ = s.partition("%")
    if sum(1 for g in s.split(":") if g) < 3 and "." not in s and not zone:
        return False
    try:
        ipaddress.IPv6Address(s)
        return True
    except ValueError:
        return False


def looks_secret(s: str) -> bool:
    """A long string that mixes letters and digits with high entropy (a key, not an identifier)."""
    letters, digits = sum(ch.isalpha() for ch in s), sum(ch.isdigit() for ch in s)
    if "/" in s and all(p.isalpha() or p.isdigit() for p in re.split(r"[/_.-]+", s.strip("/=")) if p):
        return False                       # com/pytorch/pytorch/issues/140601: a path of words and numbers
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


def value(*groups: int, keep_placeholder: bool = True) -> Callable[[re.Match[str]], str]:
    """A match with its value (the first of `groups` that took part) replaced by `<secret>`, the rest of it
    (the name, the flag, the quotes) kept; a value that is already a placeholder (`<path>`) is kept too."""
    def one(m: re.Match[str]) -> str:
        g = next(g for g in groups if m.group(g) is not None)
        if keep_placeholder and m.group(g).startswith("<"):
            return m.group(0)
        start, end = m.span(g)
        return m.group(0)[:start - m.start()] + "<secret>" + m.group(0)[end - m.start():]
    return one


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
        for value in secret_values(text):                       # the well-kept detector's findings
            text = self._sub(re.compile(rf"(?<![\w/+=-]){re.escape(value)}(?![\w/+=-])"), "<secret>", text)
        for pat in self.extra:                                  # the site's first: its word wins
            text = self._sub(re.compile(pat), "<redacted>", text)
        for host in sorted({h for h in self.hostnames if h and h != "-"}, key=len, reverse=True):
            text = self._sub(re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w-])"), "<host>", text)
        text = self._secret_values(text)
        for rx, ph in PATTERNS[:6]:                            # tokens, URIs, URLs, e-mails
            text = self._sub(rx, ph, text)
        text = self._sub_if(NODELIST, "<host>", text,     # node[001-128], dgx-h100-[041-048]; not x[1,2]
                            lambda name: name.endswith("-") or any(c.isdigit() for c in name)
                            or name.lower().startswith(CLUSTER_WORDS))
        text = self._replace(NODE_VARIABLE, "<host>", text, lambda m: f"{m.group(1)}<host>")
        text = self._sub(LINK_LOCAL, "<ip>", text)
        text = self._sub_if(IPV4, "<ip>", text, lambda a: not a.startswith(("127.", "0.0.0.0")))  # loopback names none
        text = self._sub_if(IPV6, "<ip>", text, lambda a: _ipv6(a) and a not in ("::1", "::"))
        text = self._hosts(text)
        for rx, ph in PATTERNS[6:]:
            text = self._sub(rx, ph, text)
        text = self._relative_paths(text)
        return self._sub_if(CANDIDATE, "<secret>", text, looks_secret)

    def _secret_values(self, text: str) -> str:
        """The value of an assignment to a secret-like name, whatever it looks like."""
        def quoted(m: re.Match[str]) -> str:          # a tokenizer's "[PAD]", eos_token = "</s>": no secret
            return m.group(0) if m.group(4).startswith("[") or TOKENIZER_NAME.search(m.group(1)) else value(4)(m)

        def netrc(m: re.Match[str]) -> str:
            return NETRC_VALUE.sub(lambda v: f"{v.group(1)}{v.group(2)}"
                                   + ("<host>" if v.group(1).lower() == "machine" else "<secret>"), m.group(0))
        for rx, fn in ((SECRET_ASSIGN, quoted), (SECRET_ARG, value(3)), (NETRC, netrc), (SECRET_FLAG, value(3)),
                       (CLIENT_PASSWORD, value(2)), (LOGIN_PASSWORD, value(2)),
                       (POSITIONAL, value(2, 4, 6, keep_placeholder=False)),
                       (LOGIN_CALL, value(4, keep_placeholder=False)), (AUTH_SCHEME, value(2)),
                       (QUERY_SECRET, value(2)), (SECRET_ENV, value(3, keep_placeholder=False)),
                       (SECRET_SHELL, value(2, keep_placeholder=False))):
            text = self._replace(rx, "<secret>", text, fn)
        return self._replace(SECRET_YAML, "<secret>", text, value(3, keep_placeholder=False))

    def _hosts(self, text: str) -> str:
        """Every fully qualified name but the allowed public ones and module paths (`import a.io`)."""
        def one(m: re.Match[str]) -> str:
            name = m.group(1).lower()
            before = text[text.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
            public = name in ALLOWED_EXACT or any(name == h or name.endswith("." + h) for h in ALLOWED_HOSTS)
            attribute = name.split(".", 1)[0] in ATTRIBUTE_OWNERS          # self.net, self.at: code
            return m.group(0) if public or attribute or before.startswith(("import ", "from ")) else "<host>"
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
