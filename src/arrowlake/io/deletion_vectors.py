"""Deletion vectors: the positions of a data file's rows that later writes replaced or deleted.

A vector is stored in Iceberg's ``deletion-vector-v1`` form, the same bytes as Delta's and
Paimon's 64-bit vectors, so other engines can read them:

- 4 bytes, big-endian: the length of the magic and the bitmap together;
- the magic ``D1 D3 39 64``;
- the positions as a roaring bitmap in the portable 64-bit layout (8-byte little-endian
  count of 32-bit bitmaps, then each one's 4-byte key and its 32-bit portable roaring
  bitmap), run-optimized: the bytes ``pyroaring.BitMap64.serialize()`` writes after
  ``run_optimize()``, and that pyroaring (or any portable roaring reader) reads back;
- 4 bytes, big-endian: CRC-32 of the magic and the bitmap.

Small vectors live in the metastore as these bytes; larger ones are blobs of Puffin files
(:mod:`arrowlake.io.puffin`). Reading a file with a vector keeps the rows whose position is
not in it: :func:`keep_mask` gives the mask for a range of positions, computed in numpy.

The bitmaps are built, united, written and read by the native core (:mod:`arrowlake.native`):
:func:`encode_positions` and :func:`decode_positions` go from positions to blobs and back, and
:func:`extend_many` unites many files' vectors with their new positions in one call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from arrowlake import native
from arrowlake.errors import DataFileError, ValidationError
from arrowlake.io.lru import SizedLRU
from arrowlake.io.storage import Storage

#: Iceberg's magic for a ``deletion-vector-v1`` blob.
MAGIC = b"\xd1\xd3\x39\x64"
#: The Puffin blob type of a deletion vector.
BLOB_TYPE = "deletion-vector-v1"


def encode_positions(positions: np.ndarray, before: np.ndarray | None = None
                     ) -> tuple[bytes, int]:
    """The ``deletion-vector-v1`` blob of ``positions`` united with the positions a file's
    vector held ``before`` (ascending, as :func:`decode_positions` gives them), and the
    cardinality of the union. Negative positions raise :class:`ValueError`."""
    return native.vector_encode(np.asarray(positions), before)


def extend_many(storage: Storage, files: Sequence[tuple[np.ndarray, VectorRef | None, str]]
                ) -> list[tuple[bytes, int]]:
    """Each file's new vector: ``(new positions, its current vector or None, its path)`` to
    the blob and cardinality of their union. One call extends every file in parallel without
    the GIL, uniting each current blob as a bitmap (its positions are never listed). A damaged
    current blob raises :class:`DataFileError` naming its file: the blobs are then checked
    again one by one (:func:`decode_positions` and the recorded cardinality)."""
    given: list[tuple[np.ndarray, bytes | None, int]] = []
    stored: list[tuple[VectorRef, bytes, str]] = []
    for positions, current, path in files:
        if current is None or not current.cardinality:
            given.append((positions, None, 0))
        else:
            blob, where = current._blob(storage, path)
            given.append((positions, blob, current.cardinality))
            stored.append((current, blob, where))
    try:
        return native.vector_extend_many(given)
    except ValidationError:
        for current, blob, where in stored:  # the damaged one raises, naming its file
            current._check(len(decode_positions(blob, where)), where)
        raise


def decode_positions(blob: bytes | memoryview, where: str) -> np.ndarray:
    """The positions of a ``deletion-vector-v1`` blob, ascending (uint64); a damaged blob (too
    short, a wrong length field, magic or CRC-32, a bitmap that does not parse) raises
    :class:`DataFileError` naming ``where`` (the data file the vector belongs to, and where
    the blob was kept)."""
    try:
        return native.vector_decode(blob)
    except ValidationError as exc:
        raise DataFileError(f"Deletion vector of {where} is damaged: {exc}") from None


def keep_mask(deleted: np.ndarray, start: int, length: int) -> np.ndarray | None:
    """A boolean mask over positions ``start .. start + length - 1``, True where the row is
    kept, given a file's ``deleted`` positions (ascending, as :func:`decode_positions` returns
    them). None when none of those rows is deleted: the caller keeps them as they are."""
    if length <= 0 or deleted.size == 0:
        return None
    lo, hi = np.searchsorted(deleted, np.array([start, start + length], dtype=np.uint64))
    if lo == hi:
        return None
    mask = np.ones(length, dtype=bool)
    mask[(deleted[lo:hi] - np.uint64(start)).astype(np.intp)] = False
    return mask


#: Vectors up to this many serialized bytes are kept in the metastore, larger ones in Puffin
#: files (one range read each).
INLINE_LIMIT = 4096


#: Bytes of decoded positions a process keeps (least recently used dropped past it).
DECODED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class VectorRef:
    """Where a data file's deletion vector is, as a split carries it to any reader: its
    bytes (small vectors) or a range of a Puffin file."""

    cardinality: int
    blob: bytes | None = None
    path: str | None = None  # absolute location of the Puffin file
    offset: int = 0
    length: int = 0
    since: int = 0  # the snapshot that recorded this vector (a writer extending it names it)

    def positions(self, storage: Storage, data_file: str) -> np.ndarray:
        """The deleted positions, ascending (uint64, read-only). A vector is never changed
        once written (a later one is another blob), so each is decoded once per process while
        :data:`DECODED_BYTES` keeps it."""
        known = _DECODED.get(self)
        if known is not None:
            return known
        blob, where = self._blob(storage, data_file)
        positions = decode_positions(blob, where)
        self._check(len(positions), where)
        positions.flags.writeable = False
        if positions.nbytes <= DECODED_BYTES // 4:  # a few huge ones would evict the rest
            _DECODED.put(self, positions)
        return positions

    def _blob(self, storage: Storage, data_file: str) -> tuple[bytes, str]:
        """The vector's bytes, and where they were kept (for errors)."""
        if self.blob is not None:
            blob = self.blob
            where = f"{data_file} (kept in the metastore)"
        else:
            if self.path is None:
                raise DataFileError(f"Deletion vector of {data_file} has neither bytes nor a "
                                    "Puffin file")
            blob = storage.read_range(self.path, self.offset, self.offset + self.length)
            where = f"{data_file} (in {self.path} at {self.offset})"
            if len(blob) != self.length:
                raise DataFileError(f"Deletion vector of {where} is damaged: {len(blob)} of "
                                    f"{self.length} bytes could be read")
        return blob, where

    def _check(self, cardinality: int, where: str) -> None:
        if cardinality != self.cardinality:
            raise DataFileError(f"Deletion vector of {where} is damaged: it holds "
                                f"{cardinality} positions, the metastore says "
                                f"{self.cardinality}")


#: The positions of recently read vectors, by their reference (its bytes, or the range of
#: its Puffin file: Puffin files are never rewritten).
_DECODED: SizedLRU[np.ndarray] = SizedLRU(DECODED_BYTES, lambda positions: positions.nbytes)
os.register_at_fork(after_in_child=_DECODED.after_fork)
