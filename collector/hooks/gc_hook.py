"""GC pauses via `gc.callbacks`: installed at window start, removed at window end."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from eroica.collector.critical import Execution
from eroica.schema.patterns import Category


class GcHook:
    def __init__(self, sink: Callable[[Execution], None]) -> None:
        self._sink = sink
        self._start = 0
        self._installed = False

    def _callback(self, phase: str, info: dict) -> None:
        try:
            if phase == "start":
                self._start = time.monotonic_ns()
            elif self._start:
                gen = info.get("generation", -1)
                self._sink(Execution(self._start, time.monotonic_ns(), Category.gc, f"gc.collect(gen{gen})"))
                self._start = 0
        except Exception:
            pass  # never raise inside the interpreter's GC

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def remove(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False
