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

The native core computes it (:func:`arrowlake.native.key_hash`, with the GIL released); a numpy
rendering of this definition, the code every lake written before the native core was bucketed
by, is kept in ``tests/native/reference.py`` as the oracle the native hash is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from arrowlake import native


def check_hashable(col: pa.Array | pa.ChunkedArray) -> None:
    """Refuse a key column whose type has no bucket hash (floats, nested types): a
    :class:`TypeError` naming the type (a dictionary's value type), before the native kernel
    sees the column."""
    t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    is_ = pa.types
    if not (is_.is_integer(t) or is_.is_boolean(t) or is_.is_date(t) or is_.is_time(t)
            or is_.is_timestamp(t) or is_.is_duration(t) or is_.is_decimal(t)
            or is_.is_string(t) or is_.is_large_string(t) or is_.is_string_view(t)
            or is_.is_binary(t) or is_.is_large_binary(t) or is_.is_binary_view(t)
            or is_.is_fixed_size_binary(t)):
        raise TypeError(f"Cannot hash key values of type {t}")


def _key_columns(table: pa.Table | pa.RecordBatch, key: Sequence[str]
                 ) -> list[pa.Array | pa.ChunkedArray]:
    columns = [table.column(name) for name in key]
    for col in columns:
        check_hashable(col)
    return columns


def key_hash(table: pa.Table | pa.RecordBatch, key: Sequence[str]) -> np.ndarray:
    """The combined 64-bit hash of the key columns of every row (uint64)."""
    return native.key_hash(_key_columns(table, key))


def bucket_of(table: pa.Table | pa.RecordBatch, key: Sequence[str], buckets: int) -> pa.Array:
    """The bucket of every row, as an int32 array."""
    return native.bucket_of(_key_columns(table, key), buckets)


def buckets_for_keys(values: Sequence[Sequence[object]], key_types: Sequence[pa.DataType],
                     key: Sequence[str], buckets: int) -> set[int]:
    """Buckets of explicit key values (for pruning equality and IN filters on the full key)."""
    cols = {name: pa.array([v[i] for v in values], type=typ)
            for i, (name, typ) in enumerate(zip(key, key_types, strict=True))}
    return set(bucket_of(pa.table(cols), key, buckets).to_pylist())
