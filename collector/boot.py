"""The zero-code bootstrap: the first thing eroica runs in every Python process of an attached job.

Standard library only and nothing else at import, so a process that never imports torch (the
launcher's helpers, a tokenizer subprocess) pays a dict lookup per import and nothing more. With
`EROICA_ATTACH=1` it puts one finder first on `sys.meta_path` that waits for the top-level `torch`
module to finish loading, then hands over to `eroica.collector.attach` (which patches what it needs:
`init_process_group`, the optimizer step hooks, the DataLoader iterator). Reached two ways:

- `eroica run -- CMD`: prepends `collector/bootstrap/` (one `sitecustomize.py`) to PYTHONPATH;
- a platform's image: a `.pth` file in site-packages whose one line is `import eroica.collector.boot`
  (`eroica run --print-pth` prints it); it does nothing unless `EROICA_ATTACH=1`.

Whatever fails here is one line on stderr and an unwatched job, never an exception in the user's
program.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

ATTACH_ENV = "EROICA_ATTACH"
_installed = False


def tell_user(msg: str) -> None:
    """The bootstrap's one line (a failure to attach leaves the job running unwatched)."""
    try:
        sys.stderr.write(f"eroica attach [pid {os.getpid()}]: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


class _Loader(importlib.abc.Loader):
    """torch's own loader, and the hand-over once its module finished executing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            from eroica.collector import attach

            attach.on_torch(module)
        except Exception as exc:          # a broken eroica install, a torch it does not know
            tell_user(f"not attached ({exc!r}); the job runs unwatched")

    def __getattr__(self, name: str) -> Any:     # get_source, is_package, ... for inspect and linecache
        return getattr(self.inner, name)


class _TorchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)          # once: torch is imported once per process
            for finder in sys.meta_path:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                    return spec
        except Exception as exc:
            tell_user(f"not attached (finding torch: {exc!r}); the job runs unwatched")
        return None


def install() -> bool:
    """Wait for torch in this process (attach at once when it is already loaded). Never raises."""
    global _installed
    if _installed or os.environ.get(ATTACH_ENV) != "1":
        return False
    _installed = True
    try:
        if "torch" in sys.modules:
            from eroica.collector import attach

            attach.on_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchFinder())
        return True
    except Exception as exc:
        tell_user(f"not attached ({exc!r}); the job runs unwatched")
        return False


install()
