"""A process cache bounded by the bytes of what it holds, least recently used dropped first.

For values that are the same whoever computes them (decoded vectors, key indexes, row-group
starts of immutable files), shared by a process's threads. A forked child calls
:meth:`SizedLRU.after_fork`: the parent's lock may have been held by a thread the child does
not have.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

_V = TypeVar("_V")


class SizedLRU(Generic[_V]):
    """Values by key, at most ``limit`` bytes of them as ``size`` counts a value."""

    def __init__(self, limit: int, size: Callable[[_V], int]) -> None:
        self.limit = limit
        self._size = size
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, _V] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable) -> _V | None:
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
            return found

    def put(self, key: Hashable, value: _V, limit: int | None = None) -> None:
        """Keep ``value`` for ``key`` (in place of any before); one larger than the whole
        limit only drops what ``key`` held. ``limit``: the bound for this call, in place of
        the cache's own (for caches whose bound is a setting of whoever fills them)."""
        nbytes = self._size(value)
        bound = self.limit if limit is None else limit
        with self._lock:
            self._pop(key)
            if nbytes > bound:
                return
            self._values[key] = value
            self._bytes += nbytes
            while self._bytes > bound:
                _, dropped = self._values.popitem(last=False)
                self._bytes -= self._size(dropped)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._bytes = 0

    def pop(self, key: Hashable) -> None:
        with self._lock:
            self._pop(key)

    def _pop(self, key: Hashable) -> None:
        old = self._values.pop(key, None)
        if old is not None:
            self._bytes -= self._size(old)

    def after_fork(self, keep: bool = True) -> None:
        """In a forked child: a fresh lock, and the values kept or (``keep=False``) dropped."""
        self._lock = threading.Lock()
        if not keep:
            self._values = OrderedDict()
            self._bytes = 0
