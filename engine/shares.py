"""Splitting a wide window's inputs (files, packs, chunks) among forked processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def contiguous_shares(items: Sequence[T], sizes: Sequence[int], workers: int) -> list[list[T]]:
    """`items` in `workers` contiguous shares of about equal total size (`sizes`, one per item), in
    order: the first share is the calling process's, the others go to the forked ones."""
    total = sum(sizes)
    shares: list[list[T]] = [[] for _ in range(workers)]
    acc, k = 0, 0
    for item, n in zip(items, sizes):
        if acc >= total * (k + 1) / workers and k < workers - 1:
            k += 1
        shares[k].append(item)
        acc += n
    return shares
