"""Cutting an ordered sequence into runs of consecutive items bounded in bytes: how splits are
made of files (or of whole buckets) and how small files are handed to reading threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

_T = TypeVar("_T")


def consecutive_groups(items: Sequence[_T], size: Callable[[_T], int], limit: int
                       ) -> list[list[_T]]:
    """``items`` in order, cut into runs of consecutive ones whose ``size`` adds up to at most
    ``limit`` (an item larger than that is a run of its own).

    >>> consecutive_groups([1, 2, 3, 4, 9, 1], lambda n: n, 5)
    [[1, 2], [3], [4], [9], [1]]
    """
    groups: list[list[_T]] = []
    current: list[_T] = []
    total = 0
    for item in items:
        n = size(item)
        if current and total + n > limit:
            groups.append(current)
            current, total = [], 0
        current.append(item)
        total += n
    if current:
        groups.append(current)
    return groups
