"""Column statistics and partition values: computed with Arrow, stored as JSON in the metastore.

Values are stored in a type-preserving JSON form: numbers and booleans as themselves, strings as
strings, dates, times and timestamps as integers in their unit, decimals as strings. Decoding
a whole column of stored values back into an Arrow array is one ``pa.array(...).cast(...)``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.schema import field_id

# Longer strings are not kept as min/max: they would bloat the metastore and could only be used
# truncated, which needs care for the max bound.
MAX_STAT_STRING = 256

NULL_PARTITION = "__NULL__"


def _storage_type(typ: pa.DataType) -> pa.DataType | None:
    """The JSON-friendly Arrow type values of ``typ`` are stored as, or None (no stats)."""
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return typ
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_date32(typ) or pa.types.is_time32(typ):
        return pa.int32()
    if pa.types.is_date64(typ) or pa.types.is_timestamp(typ) or pa.types.is_time64(typ) or (
        pa.types.is_duration(typ)
    ):
        return pa.int64()
    if pa.types.is_decimal(typ):
        return pa.string()
    return None


def encode_scalar(value: pa.Scalar) -> Any:
    """The stored JSON form of an Arrow scalar (None when it cannot be stored)."""
    if not value.is_valid:
        return None
    typ = value.type
    storage = _storage_type(typ)
    if storage is None:
        return None
    if pa.types.is_decimal(typ):
        return str(value.as_py())
    if storage != typ:
        if pa.types.is_timestamp(typ) and typ.tz is not None:
            value = value.cast(pa.timestamp(typ.unit))
        value = value.cast(storage)
    out = value.as_py()
    if isinstance(out, float) and math.isnan(out):
        return None
    if isinstance(out, str) and len(out) > MAX_STAT_STRING:
        return None
    return out


def encode_partition_value(value: pa.Scalar) -> Any:
    """The stored JSON form of a partition value: like :func:`encode_scalar`, but strings are
    kept whole (a partition value names its partition, it is not a bound)."""
    if value.is_valid and (pa.types.is_string(value.type) or pa.types.is_large_string(value.type)
                           or pa.types.is_string_view(value.type)):
        return value.as_py()
    return encode_scalar(value)


def decode_values(values: Sequence[Any], typ: pa.DataType) -> pa.Array:
    """Stored JSON values back into an Arrow array of ``typ`` (nulls stay null)."""
    storage = _storage_type(typ)
    if storage is None:
        return pa.nulls(len(values), typ)
    arr = pa.array(values, type=storage)
    if storage == typ:
        return arr
    if pa.types.is_timestamp(typ) and typ.tz is not None:
        return arr.cast(pa.timestamp(typ.unit)).cast(typ)
    return arr.cast(typ)


def column_stats(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> dict[str, list[Any]]:
    """``{field id: [min, max, null_count]}`` for the top-level columns of ``table``."""
    out: dict[str, list[Any]] = {}
    for field in schema:
        col = table.column(field.name)
        nulls = col.null_count
        lo = hi = None
        if _storage_type(field.type) is not None and nulls < len(col):
            try:
                mm = pc.min_max(col)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                mm = None
            if mm is not None:
                lo, hi = encode_scalar(mm["min"]), encode_scalar(mm["max"])
                if pa.types.is_floating(field.type) and (lo is None or hi is None):
                    lo = hi = None
        out[str(field_id(field))] = [lo, hi, nulls]
    return out


def merge_stats(parts: Sequence[tuple[dict[str, list[Any]], int]]) -> dict[str, list[Any]]:
    """Combine the stats of consecutive chunks ``(stats, row_count)`` of one file."""
    if len(parts) == 1:
        return parts[0][0]
    merged: dict[str, list[Any]] = {}
    for fid in parts[0][0]:
        los, his, nulls, unknown = [], [], 0, False
        for stats, rows in parts:
            lo, hi, n = stats[fid]
            nulls += n
            if n == rows:
                continue  # only nulls: no bounds, and none needed
            if lo is None or hi is None:
                unknown = True
            else:
                los.append(lo)
                his.append(hi)
        if unknown or not los:
            merged[fid] = [None, None, nulls]
        else:
            merged[fid] = [min(los), max(his), nulls]
    return merged


@functools.lru_cache(maxsize=8192)
def parse_stats(text: str) -> dict[str, list[Any]]:
    """A data file's stored statistics, parsed once: files are immutable, so planning reuses
    the parse across the steps of one plan and across scans. The result is shared: read it,
    never change it."""
    parsed: dict[str, list[Any]] = json.loads(text)
    return parsed


def stats_table(
    stats_json: Sequence[str], row_counts: pa.Array, schema: pa.Schema, columns: Sequence[str]
) -> pa.Table:
    """The stats of many files as one Arrow table, for vectorized pruning.

    Columns: ``row_count`` and, for each of ``columns``, ``min.<c>``, ``max.<c>``, ``nulls.<c>``.
    """
    decoded = [parse_stats(s) if s else {} for s in stats_json]
    arrays: list[pa.Array] = [row_counts]
    names = ["row_count"]
    for name in columns:
        field = schema.field(name)
        fid = str(field_id(field))
        triples = [d.get(fid) for d in decoded]
        lo = [t[0] if t else None for t in triples]
        hi = [t[1] if t else None for t in triples]
        nulls = [t[2] if t else None for t in triples]
        arrays += [decode_values(lo, field.type), decode_values(hi, field.type),
                   pa.array(nulls, type=pa.int64())]
        names += [f"min.{name}", f"max.{name}", f"nulls.{name}"]
    return pa.Table.from_arrays(arrays, names=names)


# -- partitions -------------------------------------------------------------------------------


def partition_path(names: Sequence[str], values: Sequence[Any]) -> str:
    """Hive-style directory for encoded partition values: ``day=2026-11-01/region=eu``."""
    parts = []
    for name, value in zip(names, values, strict=True):
        text = NULL_PARTITION if value is None else str(value)
        parts.append(f"{quote(name, safe='')}={quote(text, safe='')}")
    return "/".join(parts)


def partition_display(typ: pa.DataType, value: Any) -> Any:
    """A human-readable form of an encoded partition value, for directory names."""
    if value is None:
        return None
    arr = decode_values([value], typ)
    return str(arr[0].as_py())


def parse_partition_path(path: str) -> dict[str, str]:
    out = {}
    for part in path.split("/"):
        key, _, value = part.partition("=")
        out[unquote(key)] = unquote(value)
    return out


def partition_table(
    rows: Sequence[tuple[int, str, str]], schema: pa.Schema, partition_by: Sequence[str]
) -> pa.Table:
    """Partitions as pseudo file statistics (min = max = the value), plus ``partition_id``."""
    values = [json.loads(r[2]) for r in rows]
    arrays: list[pa.Array] = [pa.array([r[0] for r in rows], pa.int64()),
                              pa.array([1] * len(rows), pa.int64())]
    names = ["partition_id", "row_count"]
    for i, name in enumerate(partition_by):
        typ = schema.field(name).type
        col = decode_values([v[i] for v in values], typ)
        nulls = pc.cast(pc.is_null(col), pa.int64())
        arrays += [col, col, nulls]
        names += [f"min.{name}", f"max.{name}", f"nulls.{name}"]
    return pa.Table.from_arrays(arrays, names=names)
