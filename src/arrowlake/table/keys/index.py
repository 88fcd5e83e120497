"""An index of the live keys of one bucket, kept by a writing process between its writes.

Without it a merge-on-write lookup searches every live file of the bucket for every written
key (:func:`arrowlake.table.keys.lookup.locate`), so its cost grows with the files a bucket
holds between compactions. The index is one sorted array of the bucket's live keys (their
:func:`~arrowlake.merge.versions.sortable_key` image) with, for each, the file and the row
position holding it: a lookup is one binary search per written key, whatever the file count.

An index describes one state of its bucket: the set of ``(data file, vector cardinality)``
pairs of the bucket's live files. Files are never rewritten in place and vectors only grow,
so two states with the same pairs hold the same live rows. A lookup uses a cached index only
when its state is exactly the bucket's state at the lookup's snapshot; otherwise it builds one
from the files' cached key columns (:mod:`arrowlake.table.keys.lookup`). After a commit the
writer advances the index itself (:meth:`KeyIndex.advanced`): it drops the rows it marked
deleted and inserts the keys of the files it wrote, so a process that writes a table in a
loop never rebuilds it.

The searches, merges and builds run in the native core (:mod:`arrowlake.native`): the
``*_many`` functions here take many buckets at once, which one call handles in parallel
without the GIL.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from arrowlake import native
from arrowlake.io.lru import SizedLRU

#: Bytes of key indexes a process keeps (least recently used dropped past it).
INDEX_CACHE_BYTES = 256 * 1024 * 1024

State = frozenset[tuple[str, int]]

#: The recent level is merged into the base once it holds more than 1/RECENT_SHARE of it.
RECENT_SHARE = 4


#: Row positions take the low bits of a locator, the file's number in the index the rest.
_POSITION_BITS = 40
_POSITION_MASK = (1 << _POSITION_BITS) - 1


@dataclass(frozen=True)
class KeyIndex:
    """The live keys of one bucket in one state, in two sorted levels.

    The ``base`` level holds most keys and is built rarely; rows deleted since it was built
    are marked in ``dead``. The ``recent`` level holds the keys of files written since, and is
    rebuilt by every write, so a write costs in proportion to what it and its recent
    predecessors added, not to the bucket's size; once it passes a quarter of the base, both
    are merged into a new base. A key is live in at most one place. Each entry has a locator:
    ``files[locator >> 40]`` holds the key at row ``locator & (2**40 - 1)``."""

    base: np.ndarray
    base_locators: np.ndarray
    dead: np.ndarray  # bool per base entry
    recent: np.ndarray
    recent_locators: np.ndarray
    files: tuple[str, ...]
    state: State

    @property
    def nbytes(self) -> int:
        return (self.base.nbytes + self.base_locators.nbytes + self.dead.nbytes
                + self.recent.nbytes + self.recent_locators.nbytes)

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    def search(self, keys_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, indices into keys_image)`` of the written keys that are live: a binary
        search per key and level. Slots below ``len(base)`` are base entries, the others
        ``len(base) +`` a recent entry. Dead base entries are not live."""
        return native.index_search(self.base, self.dead, self.recent, keys_image)

    def where(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(file numbers, row positions)`` of the entries at ``slots``."""
        n = len(self.base)
        from_base = slots < n
        locators = np.empty(len(slots), dtype=np.int64)
        locators[from_base] = self.base_locators[slots[from_base]]
        locators[~from_base] = self.recent_locators[slots[~from_base] - n]
        return locators >> _POSITION_BITS, locators & _POSITION_MASK

    def advanced(self, removed_slots: np.ndarray, added: Sequence[tuple[str, np.ndarray]],
                 state: State) -> KeyIndex | None:
        """The index after a commit that marked the rows at ``removed_slots`` deleted and
        added files ``added`` (path, sorted key image), leaving the bucket in ``state``; None
        when the result would not hold each key once (the next lookup then builds one)."""
        return advance_many([(self, removed_slots, added, state)])[0]

    def _from_native(self, advanced: native.Advanced | None, added: Sequence[str],
                     state: State) -> KeyIndex | None:
        """The index :func:`native.index_advance_many` described (None: it gave none)."""
        if advanced is None:
            return None
        files = (*self.files, *added)
        if advanced[0] == "base":
            return _base_only(advanced[1], advanced[2], files, state)
        _, dead, recent, recent_locators = advanced  # type: ignore[misc]
        return KeyIndex(self.base, self.base_locators, dead, recent, recent_locators, files,
                        state)


def search_many(searches: Sequence[tuple[KeyIndex, np.ndarray]]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:meth:`KeyIndex.search` of many buckets: ``(index, keys image)`` each. One call
    searches every bucket in parallel without the GIL."""
    return native.index_search_many([(index.base, index.dead, index.recent, keys)
                                     for index, keys in searches])


Step = tuple[KeyIndex, np.ndarray, Sequence[tuple[str, np.ndarray]], State]


def advance_many(steps: Sequence[Step]) -> list[KeyIndex | None]:
    """:meth:`KeyIndex.advanced` of many buckets: ``(index, removed slots, added files,
    state)`` each. One call advances every bucket in parallel without the GIL: each bucket's
    removed rows are marked dead (or dropped from the recent level), the added files' keys
    merged into the recent level, and the recent level merged into the base once it holds
    more than ``1/RECENT_SHARE`` of it (or of 4096 entries, for a small base). None for a
    bucket whose added images are of another dtype than its index's, or whose result would
    not hold each key once (a written key still live)."""
    # Images of another dtype than the index's cannot join it.
    fits = [all(image.dtype == index.base.dtype for _, image in added)
            for index, _, added, _ in steps]
    given = [(index.base, index.base_locators, index.dead, index.recent,
              index.recent_locators, np.asarray(removed, dtype=np.int64),
              [image for _, image in added], len(index.files))
             for (index, removed, added, _), ok in zip(steps, fits, strict=True) if ok]
    advanced = iter(native.index_advance_many(given, RECENT_SHARE))
    return [index._from_native(next(advanced) if ok else None,
                               [path for path, _ in added], state)
            for (index, _, added, state), ok in zip(steps, fits, strict=True)]


def _base_only(image: np.ndarray, locators: np.ndarray, files: tuple[str, ...],
               state: State) -> KeyIndex:
    empty = image[:0]
    return KeyIndex(image, locators, np.zeros(len(image), dtype=bool), empty,
                    locators[:0], files, state)


Parts = Sequence[tuple[str, np.ndarray, np.ndarray | None]]


def build_many(buckets: Sequence[tuple[Parts, State]]) -> list[KeyIndex | None]:
    """:func:`build` of many buckets: ``(parts, state)`` each. One call builds every bucket
    in parallel without the GIL."""
    built = native.index_build_many([[(image, deleted) for _, image, deleted in parts]
                                     for parts, _ in buckets])
    return [None if one is None else _base_only(*one, tuple(p for p, _, _ in parts), state)
            for (parts, state), one in zip(buckets, built, strict=True)]


def build(parts: Parts, state: State) -> KeyIndex | None:
    """The index of files ``parts``: (path, its sorted key image, its deleted positions or
    None), its keys all in the base level; None when there are no parts, the images do not
    share one dtype or a key is live twice."""
    return build_many([(parts, state)])[0]


_INDEXES: SizedLRU[KeyIndex] = SizedLRU(INDEX_CACHE_BYTES, lambda index: index.nbytes)


def cached(key: Hashable, state: State) -> KeyIndex | None:
    """The cached index of bucket ``key`` if it describes ``state``."""
    index = _INDEXES.get(key)
    return index if index is not None and index.state == state else None


def keep(key: Hashable, index: KeyIndex | None) -> None:
    """Cache ``index`` as bucket ``key``'s (None forgets the bucket's)."""
    if index is None:
        _INDEXES.pop(key)
    else:
        _INDEXES.put(key, index)


def _forget_indexes() -> None:
    """In a forked child: start with an empty cache and a fresh lock."""
    _INDEXES.after_fork(keep=False)


os.register_at_fork(after_in_child=_forget_indexes)

__all__ = ["KeyIndex", "State", "build", "cached", "keep"]
