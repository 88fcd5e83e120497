"""Reference implementations the native core is tested against: slow and obvious where they can
be, never used by arrowlake itself.

- The bucket hash: the numpy code that bucketed every lake written before the native core (it
  was ``arrowlake/merge/bucketing.py``'s, moved here unchanged when the native hash became the
  only one). Its values define the buckets of existing lakes; the native hash must equal it.
- The key index: finding keys in a sorted level, searching an index's two levels, merging two
  levels, building an index from files and advancing one after a commit, each written as plain
  set and sort operations.
- Deletion vectors: ``deletion-vector-v1`` blobs written and read with pyroaring (the bitmap
  library other engines' portable 64-bit roaring bytes come from) and the framing written out
  with :mod:`struct` and :mod:`zlib`.
"""

from __future__ import annotations

import array
import struct
import zlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

# -- the bucket hash (numpy) ------------------------------------------------------------------

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer (uint64 in, uint64 out, wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _bytes_hash(arr: pa.Array) -> np.ndarray:
    """FNV-1a of each value's bytes, vectorized across rows (one pass per byte position)."""
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string())
    if pa.types.is_large_binary(arr.type) or pa.types.is_binary_view(arr.type):
        arr = arr.cast(pa.binary())
    if pa.types.is_string(arr.type):
        arr = arr.cast(pa.binary())
    n = len(arr)
    arr = arr.fill_null(b"") if arr.null_count else arr
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1,
                            offset=arr.offset * 4)
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    max_len = int(lengths.max()) if n else 0
    if n and max_len > 0 and int(lengths.min()) == max_len:
        # Equal lengths (codes, UUIDs, fixed-width text): the bytes are a (rows, width) matrix.
        first = int(offsets[0])
        matrix = raw[first:first + n * max_len].reshape(n, max_len)
        with np.errstate(over="ignore"):
            for i in range(max_len):
                h = (h ^ matrix[:, i].astype(np.uint64)) * _FNV_PRIME
        return h
    with np.errstate(over="ignore"):
        for i in range(max_len):
            active = np.flatnonzero(lengths > i)
            byte = raw[starts[active] + i].astype(np.uint64)
            h[active] = (h[active] ^ byte) * _FNV_PRIME
    return h


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_decimal(t))


def _few_distinct(col: pa.Array) -> bool:
    """Whether a sample of the column repeats enough that hashing its distinct values and
    gathering beats hashing every value's bytes."""
    sample = col.slice(0, 16_384)
    return len(pc.unique(sample)) * 4 <= len(sample)


def column_hash(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The bucket hash of one key column, per row (uint64)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_string_view(col.type):
        col = col.cast(pa.string())  # and so are nulls once dictionary-encoded
    elif pa.types.is_binary_view(col.type):
        col = col.cast(pa.binary())
    if not pa.types.is_dictionary(col.type) and _is_bytes(col.type) and len(col) > 16_384 \
            and _few_distinct(col):
        col = pc.dictionary_encode(col, null_encoding="encode")
    if pa.types.is_dictionary(col.type):
        # Hash each distinct value once (categoricals, low-cardinality text) and gather.
        codes = col.indices
        per_value = column_hash(col.dictionary)
        valid = codes.is_valid().to_numpy(zero_copy_only=False) if codes.null_count else None
        index = np.asarray(codes.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        h = per_value[index] if len(per_value) else np.zeros(len(col), np.uint64)
        return np.where(valid, h, _NULL_HASH) if valid is not None else h
    t = col.type
    nulls = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
    if pa.types.is_decimal(t):
        col, t = col.cast(pa.string()), pa.string()
    if _is_bytes(t):
        if pa.types.is_fixed_size_binary(t):
            col = col.cast(pa.binary())
        h = _mix(_bytes_hash(col))
    else:
        if pa.types.is_boolean(t):
            ints = col.cast(pa.int64())
        elif pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or (
                pa.types.is_time64(t)):
            ints = col.view(pa.int64()) if not pa.types.is_timestamp(t) or t.tz is None \
                else col.cast(pa.timestamp(t.unit)).view(pa.int64())
        elif pa.types.is_date32(t) or pa.types.is_time32(t):
            ints = col.view(pa.int32()).cast(pa.int64())
        elif pa.types.is_integer(t):
            ints = col.cast(pa.int64(), safe=False)
        else:
            raise TypeError(f"Cannot hash key values of type {t}")
        if ints.null_count:
            ints = pc.fill_null(ints, 0)
        values = ints.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        h = _mix(values.view(np.uint64))
    if nulls is not None:
        h = np.where(nulls, _NULL_HASH, h)
    return h


def key_hash(table: pa.Table | pa.RecordBatch, key: Sequence[str]) -> np.ndarray:
    """The combined 64-bit hash of the key columns of every row."""
    h = column_hash(table.column(key[0]))
    with np.errstate(over="ignore"):
        for name in key[1:]:
            h = _mix(h * np.uint64(31) + column_hash(table.column(name)))
    return h


def bucket_of(table: pa.Table | pa.RecordBatch, key: Sequence[str], buckets: int) -> pa.Array:
    """The bucket of every row, as an int32 array."""
    h = key_hash(table, key)
    return pa.array((h % np.uint64(buckets)).astype(np.int32))


# -- the key index ----------------------------------------------------------------------------

#: A locator: the file's number in the index above these bits, the row position below.
POSITION_BITS = 40


def locators(file_number: int, positions: np.ndarray) -> np.ndarray:
    return (np.int64(file_number) << POSITION_BITS) | np.asarray(positions, dtype=np.int64)


def find(level: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key: whether the sorted ``level`` holds it, and where it is or would go
    (``np.searchsorted``, left)."""
    at = np.searchsorted(level, keys)
    found = np.array([i < len(level) and level[i] == k for i, k in zip(at, keys, strict=True)],
                     dtype=bool)
    return found, at.astype(np.int64)


def search(base: np.ndarray, dead: np.ndarray, recent: np.ndarray, keys: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, indices into keys)`` of the keys live in an index, in the order of ``keys``: a
    base entry's slot is its position, a recent entry's ``len(base) +`` its position."""
    where_base = {k: i for i, k in enumerate(base.tolist()) if not dead[i]}
    where_recent = {k: len(base) + i for i, k in enumerate(recent.tolist())}
    slots, incoming = [], []
    for i, k in enumerate(keys.tolist()):
        slot = where_base.get(k, where_recent.get(k))
        if slot is not None:
            slots.append(slot)
            incoming.append(i)
    return np.array(slots, dtype=np.int64), np.array(incoming, dtype=np.int64)


def sorted_level(keys: np.ndarray, locs: np.ndarray, dtype: np.dtype
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """Entries as one level: sorted by key, None when a key repeats."""
    keys = np.asarray(keys, dtype=dtype)
    if len(set(keys.tolist())) != len(keys):
        return None
    order = np.argsort(keys, kind="stable")
    return keys[order], np.asarray(locs, dtype=np.int64)[order]


def merge(a: np.ndarray, a_locators: np.ndarray, b: np.ndarray, b_locators: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Two sorted levels as one; ``(None, None)`` if they share a key."""
    level = sorted_level(np.concatenate([a, b]), np.concatenate([a_locators, b_locators]),
                         a.dtype)
    return (None, None) if level is None else level


def build(parts: Sequence[tuple[np.ndarray, np.ndarray | None]]
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """An index's level from files' sorted key images, each with its deleted positions or
    None: the live rows of every file, with locators (file number, row), sorted by key; None
    without parts, for images of different dtypes, or when a key is live twice."""
    if not parts or len({image.dtype for image, _ in parts}) > 1:
        return None
    keys, locs = [], []
    for number, (image, deleted) in enumerate(parts):
        gone = set() if deleted is None else {int(d) for d in deleted}
        live = np.array([row for row in range(len(image)) if row not in gone], dtype=np.int64)
        keys.append(image[live])
        locs.append(locators(number, live))
    return sorted_level(np.concatenate(keys), np.concatenate(locs), parts[0][0].dtype)


#: An index's levels: base, base locators, dead, recent, recent locators.
Levels = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def advance(levels: Levels, files: int, removed: np.ndarray, added: Sequence[np.ndarray],
            recent_share: int) -> Levels | None:
    """An index's levels after a commit (``files``: how many files the index names): the
    entries at slots ``removed`` leave (base entries are marked dead, recent ones dropped), the
    keys of the ``added`` images (new files numbered from ``files``) join the recent level, and
    when the recent level then holds more than ``1/recent_share`` of the base (or of 4096
    entries), it and the live base entries become a new base. None when the images' dtype is
    not the index's, or a key would be live twice."""
    base, base_locators, dead, recent, recent_locators = levels
    if any(image.dtype != base.dtype for image in added):
        return None
    removed_set = {int(s) for s in removed}
    dead = np.array([bool(d) or i in removed_set for i, d in enumerate(dead)], dtype=bool)
    kept = np.array([i for i in range(len(recent)) if len(base) + i not in removed_set],
                    dtype=np.int64)
    keys = [recent[kept], *added]
    locs = [recent_locators[kept],
            *(locators(files + f, np.arange(len(image))) for f, image in enumerate(added))]
    level = sorted_level(np.concatenate(keys), np.concatenate(locs), base.dtype)
    if level is None or set(level[0].tolist()) & set(base[~dead].tolist()):
        return None
    new_recent, new_recent_locators = level
    if len(new_recent) * recent_share <= max(len(base), 4096):
        return base, base_locators, dead, new_recent, new_recent_locators
    whole = sorted_level(np.concatenate([base[~dead], new_recent]),
                         np.concatenate([base_locators[~dead], new_recent_locators]), base.dtype)
    assert whole is not None
    return whole[0], whole[1], np.zeros(len(whole[0]), dtype=bool), whole[0][:0], whole[1][:0]


# -- deletion vectors (pyroaring) -------------------------------------------------------------

#: Iceberg's magic for a ``deletion-vector-v1`` blob.
MAGIC = b"\xd1\xd3\x39\x64"


def bitmap(positions: Sequence[int] | np.ndarray) -> BitMap64:
    """A pyroaring bitmap of ``positions``."""
    values = np.ascontiguousarray(positions, dtype=np.uint64)
    return BitMap64(array.array("Q", values.tobytes()))


def frame(bitmap_bytes: bytes) -> bytes:
    """Portable 64-bit roaring bytes framed as a ``deletion-vector-v1`` blob: the big-endian
    length of magic and bitmap, the magic, the bitmap, the big-endian CRC-32 of magic and
    bitmap."""
    body = MAGIC + bitmap_bytes
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def blob(positions: Sequence[int] | np.ndarray) -> bytes:
    """The ``deletion-vector-v1`` blob pyroaring writes for ``positions`` (run-optimized)."""
    vector = bitmap(positions)
    vector.run_optimize()
    return frame(vector.serialize())


def unframe(data: bytes) -> bytes:
    """The bitmap bytes of a blob, asserting its framing (length, magic, CRC-32)."""
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 8, "the length field counts the magic and the bitmap"
    assert data[4:8] == MAGIC
    (crc,) = struct.unpack(">I", data[-4:])
    assert crc == zlib.crc32(data[4:-4])
    return data[8:-4]


def blob_positions(data: bytes) -> list[int]:
    """The positions pyroaring reads from a blob, ascending."""
    return list(BitMap64.deserialize(unframe(data)))
