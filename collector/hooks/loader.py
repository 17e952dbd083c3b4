"""Data-loading time: every `next()` of the wrapped loader is one `DataLoader.__next__` execution."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, cast

from eroica.schema.patterns import Category


class TimedLoader:
    """Wraps the user's loader; `record(t0_ns, category, name)` never raises (the Monitor's)."""

    def __init__(self, record: Callable[[int, Category, str], None], loader: Iterable[Any]) -> None:
        self._record = record
        self._loader = loader

    def __len__(self) -> int:
        return len(cast(Sized, self._loader))   # a loader over a sized dataset has one; others raise TypeError

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._loader)
        while True:
            t0 = time.monotonic_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            self._record(t0, Category.data, "DataLoader.__next__")
            yield item
