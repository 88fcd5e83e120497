"""The bucket hash of primary-key tables: stable, documented, vectorized.

A row's bucket is ``bucket_hash(key) % buckets``, where ``bucket_hash`` is computed per key
column and combined:

- integers, booleans, dates, times, timestamps and durations: the value as a signed 64-bit
  integer (timestamps in their unit, dates in days) mixed with the SplitMix64 finalizer;
- strings and binaries: 64-bit FNV-1a over the UTF-8 / raw bytes, then the finalizer;
- decimals: their string form, hashed as a string;
- null: the constant ``0x9E3779B97F4A7C15`` (keys are never null; the case is defined anyway).

A single key column's hash is the column hash; several combine left to right as
``h = mix(h * 31 + column_hash)``, starting from the first column's hash, all arithmetic modulo
2**64. Any engine can reproduce the bucket from this text; the
values are pinned by ``tests/merge/test_bucketing.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake import native

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


def check_hashable(col: pa.Array | pa.ChunkedArray) -> None:
    """The numpy path's refusal of a type, before the native kernel sees the column."""
    t = col.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (_is_bytes(t) or pa.types.is_boolean(t) or pa.types.is_integer(t)
            or pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date(t)
            or pa.types.is_time(t)):
        raise TypeError(f"Cannot hash key values of type {t}")


def _native_columns(table: pa.Table | pa.RecordBatch, key: Sequence[str]
                    ) -> list[pa.Array | pa.ChunkedArray] | None:
    if not native.enabled():
        return None
    columns = [table.column(name) for name in key]
    for col in columns:
        check_hashable(col)
    return columns


def key_hash(table: pa.Table | pa.RecordBatch, key: Sequence[str]) -> np.ndarray:
    """The combined 64-bit hash of the key columns of every row."""
    columns = _native_columns(table, key)
    if columns is not None:
        return native.key_hash(columns)
    h = column_hash(table.column(key[0]))
    with np.errstate(over="ignore"):
        for name in key[1:]:
            h = _mix(h * np.uint64(31) + column_hash(table.column(name)))
    return h


def bucket_of(table: pa.Table | pa.RecordBatch, key: Sequence[str], buckets: int) -> pa.Array:
    """The bucket of every row, as an int32 array."""
    columns = _native_columns(table, key)
    if columns is not None:
        return native.bucket_of(columns, buckets)
    h = key_hash(table, key)
    return pa.array((h % np.uint64(buckets)).astype(np.int32))


def buckets_for_keys(values: Sequence[Sequence[object]], key_types: Sequence[pa.DataType],
                     key: Sequence[str], buckets: int) -> set[int]:
    """Buckets of explicit key values (for pruning equality and IN filters on the full key)."""
    cols = {name: pa.array([v[i] for v in values], type=typ)
            for i, (name, typ) in enumerate(zip(key, key_types, strict=True))}
    return set(bucket_of(pa.table(cols), key, buckets).to_pylist())
