"""Cyclic garbage collection held off or narrowed where it only rescans live objects (a speed trick,
in one place beside eroica.cli.fastpath, which holds the batch commands').

- Loading a window (eroica.engine.load) makes many objects and no cycles: collection is held off
  while it runs (`held_off`).
- A service HTTP process freezes what it built while starting (the app, the imported modules, the
  database engine) out of every later collection (`freeze_startup`): they live as long as the
  process, and each full collection walked all of them again while the requests' short-lived
  documents were collected.
- A diagnosis worker does the same once the engine is imported and the knowledge compiled, and
  holds collection off while it diagnoses a window (`held_off`): decoding a wide window's chunks
  makes hundreds of thousands of small containers that all live until the diagnosis is done, so
  each collection during it was wasted work. Cycles made meanwhile are collected afterwards.
Their effect is measured by `bench/serve.py` (documents/s and the time to a wide window's diagnosis).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_startup() -> None:
    """Everything allocated so far stays out of every later collection."""
    gc.freeze()


@contextmanager
def held_off() -> Iterator[None]:
    """No cyclic collection inside; the state it had is restored after (a no-op where it was off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
