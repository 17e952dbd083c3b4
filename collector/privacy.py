"""The operator's privacy level, applied to a pattern document before it leaves the rank's process.

- `keep` (default): names as they are.
- `hash`: user function names (user regions, Python functions), file paths and the hostname are
  replaced by a salted hash, stable for the job (every rank uses the same salt, agreed through the
  job's store), so peers still compare and the diagnosis is unchanged.
- `drop`: as `hash`, and the hostname and configuration values are removed, and no raw trace kept.
Framework names (torch ops, kernels, collectives, the data loader) are kept: they are not customer code.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from typing import Any

from eroica.schema.patterns import Category, ConfigFact, PatternsDoc

LEVELS = ("keep", "hash", "drop")
ENV = "EROICA_PRIVACY"
SALT_KEY = "eroica/privacy-salt"
USER_CATEGORIES = {Category.region, Category.python}
PATH = re.compile(r"(/[\w.@+-]+){2,}|[\w.-]+\.py\b")
BUILTIN_NODE = re.compile(r"\w+Backward\d+|torch::autograd::\w+")   # a user's autograd.Function's is its class


def level_from(value: str | None) -> str:
    level = (value or os.environ.get(ENV) or "keep").strip().lower()
    if level not in LEVELS:
        raise ValueError(f"privacy level {level!r}: use one of {', '.join(LEVELS)}")
    return level


def agree_salt(store: Any) -> str:
    """One salt for the whole job: the first rank to ask sets it in the store, the others read it."""
    if store is None:
        return secrets.token_hex(16)
    got = store.compare_set(SALT_KEY, "", secrets.token_hex(16))
    return got.decode() if isinstance(got, bytes) else str(got)


class Privacy:
    def __init__(self, level: str, salt: str) -> None:
        self.level, self.salt = level, salt

    def token(self, text: str, prefix: str = "h") -> str:
        return f"{prefix}-{hashlib.sha256((self.salt + text).encode()).hexdigest()[:12]}"

    def _scrub(self, text: str) -> str:
        return PATH.sub(lambda m: self.token(m.group(0), "path"), text)

    def apply(self, doc: PatternsDoc) -> PatternsDoc:
        if self.level == "keep":
            return doc
        funcs = [f.model_copy(update={"name": self.token(f.name, "fn")})
                 if f.category in USER_CATEGORIES and f.name != "untracked" else
                 f.model_copy(update={"name": self._scrub(f.name)}) for f in doc.functions]
        host = "-" if self.level == "drop" else self.token(doc.job.hostname, "host")
        config = [] if self.level == "drop" else [ConfigFact(key=c.key, value=self._scrub(c.value)) for c in doc.config]
        gaps = [g.model_copy(update={"reason": self._scrub(g.reason)}) for g in doc.gaps]
        nodes = {k if BUILTIN_NODE.fullmatch(k) else self.token(k, "fn"): v
                 for k, v in doc.autograd_nodes_total.items()}
        return doc.model_copy(update={"functions": funcs, "job": doc.job.model_copy(update={"hostname": host}),
                                      "config": config, "gaps": gaps, "privacy": self.level,
                                      "autograd_nodes_total": nodes})
