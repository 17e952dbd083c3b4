"""Where in the user's code a step, a region and a data loader are: `path:line`, kept as config facts
(`site.step`, `site.region.<name>`, `site.loader`) so a drafted fix can target the exact call the
evidence names (eroica.assistant). Each site is looked up once (first use), by walking the caller's
frames past torch, eroica and the standard library's plumbing; it never raises. Privacy levels
`hash` and `drop` hash or drop these paths like every other config value."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

SITE_PREFIX = "site."
MAX_SITES = 64
_SKIP = (os.sep + "torch" + os.sep, os.sep + "eroica" + os.sep, "contextlib.py", "functools.py", "threading.py",
         "<frozen", "lightning" + os.sep, "accelerate" + os.sep, "transformers" + os.sep)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = tuple(os.path.join(_ROOT, d) + os.sep for d in ("collector", "engine", "assistant", "service", "cli"))


def _plumbing(filename: str) -> bool:
    return filename.startswith(OURS) or any(s in filename for s in _SKIP)


def caller_site(depth: int = 1, frames: int = 3) -> str | None:
    """The first `frames` user frames outside the plumbing, from `depth` frames above the caller,
    innermost first: `path:line < path:line < ...` (a step inside a helper names the loop's line too)."""
    out: list[str] = []
    try:
        f: Any = sys._getframe(depth + 1)
        for _ in range(60):
            if f is None or len(out) >= frames:
                break
            name = f.f_code.co_filename
            if not _plumbing(name):
                out.append(f"{os.path.abspath(name)}:{f.f_lineno}")
            f = f.f_back
    except Exception:
        pass
    return " < ".join(out) or None


def remember_site(config: dict[str, str], key: str, site: str | None) -> None:
    """Record a site once (the first one wins; bounded)."""
    try:
        k = SITE_PREFIX + key
        if site and k not in config and sum(1 for c in config if c.startswith(SITE_PREFIX)) < MAX_SITES:
            config[k] = site
    except Exception:
        pass


def install_loader_sites() -> None:
    """Remember where each DataLoader is constructed (`loader._eroica_site`) and hand it to its
    iterators: a class-level wrapper, idempotent, installed only when torch is already imported."""
    try:
        if "torch.utils.data" not in sys.modules and "torch" not in sys.modules:
            return
        dl = sys.modules["torch.utils.data.dataloader"] if "torch.utils.data.dataloader" in sys.modules else \
            __import__("torch.utils.data.dataloader", fromlist=["DataLoader"])
        cls, it_cls = dl.DataLoader, dl._BaseDataLoaderIter
        if getattr(cls.__init__, "_eroica_site", False):
            return
        init, it_init = cls.__init__, it_cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            try:
                object.__setattr__(self, "_eroica_site", caller_site(1))
            except Exception:
                pass

        @functools.wraps(it_init)
        def it__init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            it_init(self, loader, *args, **kwargs)
            try:
                self._eroica_site = getattr(loader, "_eroica_site", None)
            except Exception:
                pass

        __init__._eroica_site = True  # type: ignore[attr-defined]
        cls.__init__ = __init__
        it_cls.__init__ = it__init__
    except Exception:
        pass
