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


def _locators(file_number: int, positions: np.ndarray) -> np.ndarray:
    return (np.int64(file_number) << _POSITION_BITS) | positions.astype(np.int64)


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
        ``len(base) +`` a recent entry."""
        if native.enabled():
            return native.index_search(self.base, self.dead, self.recent, keys_image)
        in_base, at_base = _find(self.base, keys_image)
        in_base[in_base] = ~self.dead[at_base[in_base]]
        in_recent, at_recent = _find(self.recent, keys_image)
        incoming = np.flatnonzero(in_base | in_recent).astype(np.int64)
        slots = np.where(in_base[incoming], at_base[incoming],
                         len(self.base) + at_recent[incoming]).astype(np.int64)
        return slots, incoming

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

    def _numpy_levels(self, removed_slots: np.ndarray, added: Sequence[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The numpy path of :func:`advance_many` up to the merge into the base: ``(dead,
        recent, recent locators)``, or None when a key would be held twice."""
        n = len(self.base)
        dead = self.dead.copy()
        dead[removed_slots[removed_slots < n]] = True
        keep = np.ones(len(self.recent), dtype=bool)
        keep[removed_slots[removed_slots >= n] - n] = False
        recent, recent_locators = self.recent[keep], self.recent_locators[keep]
        for number, image in enumerate(added, start=len(self.files)):
            in_base, at_base = _find(self.base, image)
            if in_base.any() and not bool(dead[at_base[in_base]].all()):
                return None  # a written key still live in the base
            merged, merged_locators = _merge(
                recent, recent_locators, image,
                _locators(number, np.arange(len(image), dtype=np.int64)))
            if merged is None or merged_locators is None:
                return None
            recent, recent_locators = merged, merged_locators
        return dead, recent, recent_locators

    def _settled(self, levels: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                 added: Sequence[str], state: State) -> KeyIndex | None:
        """The index of the new levels (numpy path), its recent level merged into the base
        once it passes a quarter of it."""
        if levels is None:
            return None
        dead, recent, recent_locators = levels
        files = (*self.files, *added)
        if len(recent) * RECENT_SHARE <= max(len(self.base), 4096):
            return KeyIndex(self.base, self.base_locators, dead, recent, recent_locators, files,
                            state)
        live = ~dead
        base, base_locators = _merge(self.base[live], self.base_locators[live], recent,
                                     recent_locators)
        if base is None or base_locators is None:
            return None
        return _base_only(base, base_locators, files, state)

    def _from_native(self, advanced: native.Advanced | None, added: Sequence[str],
                     state: State) -> KeyIndex | None:
        """The index :func:`native.index_advance_many` described."""
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
    """:meth:`KeyIndex.search` of many buckets: ``(index, keys image)`` each. On the native
    path one call searches every bucket in parallel without the GIL."""
    if native.enabled():
        return native.index_search_many([(index.base, index.dead, index.recent, keys)
                                         for index, keys in searches])
    return [index.search(keys) for index, keys in searches]


Step = tuple[KeyIndex, np.ndarray, Sequence[tuple[str, np.ndarray]], State]


def advance_many(steps: Sequence[Step]) -> list[KeyIndex | None]:
    """:meth:`KeyIndex.advanced` of many buckets: ``(index, removed slots, added files,
    state)`` each. On the native path one call advances every bucket in parallel without the
    GIL."""
    # Images of another dtype than the index's cannot join it.
    fits = [all(image.dtype == index.base.dtype for _, image in added)
            for index, _, added, _ in steps]
    if native.enabled():
        given = [(index.base, index.base_locators, index.dead, index.recent,
                  index.recent_locators, np.asarray(removed, dtype=np.int64),
                  [image for _, image in added], len(index.files))
                 for (index, removed, added, _), ok in zip(steps, fits, strict=True) if ok]
        advanced = iter(native.index_advance_many(given, RECENT_SHARE))
        return [index._from_native(next(advanced) if ok else None,
                                   [path for path, _ in added], state)
                for (index, _, added, state), ok in zip(steps, fits, strict=True)]
    levels = [index._numpy_levels(removed, [image for _, image in added]) if ok else None
              for (index, removed, added, _), ok in zip(steps, fits, strict=True)]
    return [index._settled(level, [path for path, _ in added], state)
            for (index, _, added, state), level in zip(steps, levels, strict=True)]


def _merge(a: np.ndarray, a_locators: np.ndarray, b: np.ndarray, b_locators: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Two sorted levels as one, in one pass over both; (None, None) if they share a key."""
    if native.enabled():
        return native.index_merge(a, a_locators, b, b_locators)
    found, at = _find(a, b)
    if found.any():
        return None, None
    at = at + np.arange(len(b))
    image = np.empty(len(a) + len(b), dtype=a.dtype)
    locators = np.empty(len(image), dtype=np.int64)
    from_a = np.ones(len(image), dtype=bool)
    from_a[at] = False
    image[from_a], image[at] = a, b
    locators[from_a], locators[at] = a_locators, b_locators
    return image, locators


def _base_only(image: np.ndarray, locators: np.ndarray, files: tuple[str, ...],
               state: State) -> KeyIndex:
    empty = image[:0]
    return KeyIndex(image, locators, np.zeros(len(image), dtype=bool), empty,
                    locators[:0], files, state)


def _find(level: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key: whether ``level`` (sorted) holds it, and where (or where it would go)."""
    if native.enabled():
        return native.index_find(level, keys)
    at = np.searchsorted(level, keys)
    found = np.zeros(len(keys), dtype=bool)
    inside = at < len(level)
    found[inside] = level[at[inside]] == keys[inside]
    return found, at


def _unique(image: np.ndarray) -> bool:
    return len(image) < 2 or bool(np.all(image[1:] > image[:-1]))


Parts = Sequence[tuple[str, np.ndarray, np.ndarray | None]]


def build_many(buckets: Sequence[tuple[Parts, State]]) -> list[KeyIndex | None]:
    """:func:`build` of many buckets: ``(parts, state)`` each. On the native path one call
    builds every bucket in parallel without the GIL."""
    if not native.enabled():
        return [build(parts, state) for parts, state in buckets]
    built = native.index_build_many([[(image, deleted) for _, image, deleted in parts]
                                     for parts, _ in buckets])
    return [None if one is None else _base_only(*one, tuple(p for p, _, _ in parts), state)
            for (parts, state), one in zip(buckets, built, strict=True)]


def build(parts: Parts, state: State) -> KeyIndex | None:
    """The index of files ``parts``: (path, its sorted key image, its deleted positions or
    None); None when the images do not share one type or a key is live twice."""
    if not parts:
        return None
    if native.enabled():
        return build_many([(parts, state)])[0]
    dtype = parts[0][1].dtype
    images, locators = [], []
    for i, (_, image, deleted) in enumerate(parts):
        if image.dtype != dtype:
            return None
        rows = np.arange(len(image), dtype=np.int64)
        if deleted is not None and len(deleted):
            keep = np.ones(len(image), dtype=bool)
            keep[deleted[deleted < len(image)].astype(np.int64)] = False
            image, rows = image[keep], rows[keep]
        images.append(image)
        locators.append(_locators(i, rows))
    image = np.concatenate(images)
    # Each file's image is sorted already: a stable sort merges the runs.
    order = np.argsort(image, kind="stable")
    image = image[order]
    if not _unique(image):
        return None
    return _base_only(image, np.concatenate(locators)[order], tuple(p for p, _, _ in parts),
                      state)


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
