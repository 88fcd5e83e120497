"""Column statistics and partition values: computed with Arrow, stored as JSON in the metastore.

Values are stored in a type-preserving JSON form: numbers and booleans as themselves, strings as
strings, dates, times and timestamps as integers in their unit, decimals as strings. Decoding
a whole column of stored values back into an Arrow array is one ``pa.array(...).cast(...)``.

A file's statistics are ``{field id: [min, max, nulls]}`` plus, for float columns, a fourth
entry: the number of NaN values (min and max skip NaN). ``"v": 2`` marks statistics written
since decimal bounds are merged as numbers; decimal bounds without it may be wrong (they were
merged across row groups as strings) and are read as unknown.

Where the Parquet writer's row-group statistics hold a column's bounds exactly, in the stored
form (integers, float32/64, booleans, date32, timestamps, times and durations in the units it
writes unchanged, short strings: :func:`footer_layout`), the data file writer takes them from
the footer it wrote instead of computing ``min_max`` (:func:`fill_deferred_bounds`); null and
NaN counts are always counted here. A bound the footer does not hold exactly stays unknown.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.schema import field_id

# Longer strings are not kept as min/max: they would bloat the metastore and could only be used
# truncated, which needs care for the max bound.
MAX_STAT_STRING = 256

#: A null partition value in a directory name: ``quote`` never writes parentheses, so no value
#: is named like it. (Until the defects issue's item 6 nulls were ``__NULL__``, the name of the
#: string "__NULL__" too; existing partitions keep their paths.)
NULL_PARTITION = "(null)"

#: The key of the statistics format version in a file's statistics (absent: version 1).
STATS_VERSION_KEY = "v"
#: Version 2: decimal bounds merged as numbers, NaN counted for float columns.
STATS_VERSION = 2


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
    return column_stats_deferring(table, schema, defer=False)[0]


#: Strings shorter than this many bytes take their bounds from the Parquet writer's statistics
#: (:func:`fill_deferred_bounds`) rather than from ``min_max``, which is slow on strings. Arrow's
#: writer keeps such bounds exact (it drops, never truncates, values over 4 KiB); writers that
#: truncate do so at 64 bytes or more, so a value this short is never a truncated one.
PARQUET_STRING_BOUND_BYTES = 32


def _is_string(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or \
        pa.types.is_string_view(typ)


_TIME_UNITS = {"ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


@functools.lru_cache(maxsize=512)
def footer_layout(typ: pa.DataType) -> tuple[str, str | None, bool] | None:
    """How Arrow's Parquet writer stores a column of ``typ`` when its row-group statistics
    hold the column's bounds exactly as they are stored here, else None: ``(physical type,
    time unit of the logical type or None, whether the bounds are read as physical values)``.

    Integers of every width are read through their logical type (an unsigned 32-bit column is
    physically a signed INT32); dates, timestamps, times and durations as the physical integer,
    which is the value in the column's unit, UTC for timestamps with a time zone. Left out,
    since the writer changes their values: ``date64`` (written as days), ``timestamp[s]`` and
    ``time32[s]`` (written as milliseconds), and half floats (bytes).
    """
    t = pa.types
    if t.is_integer(typ):
        return ("INT64" if typ.bit_width == 64 else "INT32"), None, False
    if t.is_float32(typ):
        return "FLOAT", None, False
    if t.is_float64(typ):
        return "DOUBLE", None, False
    if t.is_boolean(typ):
        return "BOOLEAN", None, False
    if t.is_date32(typ):
        return "INT32", None, True
    if t.is_duration(typ):
        return "INT64", None, True
    if (t.is_timestamp(typ) or t.is_time(typ)) and typ.unit in _TIME_UNITS:
        return ("INT32" if t.is_time32(typ) else "INT64"), _TIME_UNITS[typ.unit], True
    return None


def column_stats_deferring(table: pa.Table | pa.RecordBatch, schema: pa.Schema, *,
                           defer: bool = True
                           ) -> tuple[dict[str, list[Any]], list[tuple[str, str]]]:
    """:func:`column_stats`, except that with ``defer`` the bounds of the columns the Parquet
    writer bounds exactly are left for :func:`fill_deferred_bounds` to take from the Parquet
    statistics of the row group these rows were written as: columns of the types
    :func:`footer_layout` names, and string columns whose values are all shorter than
    :data:`PARQUET_STRING_BOUND_BYTES`. Null and NaN counts are always ours. Returns the stats
    and the deferred columns as ``(field id, name)``."""
    out: dict[str, list[Any]] = {}
    deferred: list[tuple[str, str]] = []
    for field in schema:
        col = table.column(field.name)
        fid = str(field_id(field))
        nulls = col.null_count
        entry: list[Any] = [None, None, nulls]
        if pa.types.is_floating(field.type):
            entry.append(int(pc.sum(pc.is_nan(col)).as_py() or 0) if nulls < len(col) else 0)
        out[fid] = entry
        if _storage_type(field.type) is None or nulls == len(col):
            continue
        if defer and "." not in field.name and (footer_layout(field.type) is not None or (
                _is_string(field.type) and (pc.max(pc.binary_length(col)).as_py() or 0)
                < PARQUET_STRING_BOUND_BYTES)):
            deferred.append((fid, field.name))
            continue
        try:
            mm = pc.min_max(col)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            continue
        lo, hi = encode_scalar(mm["min"]), encode_scalar(mm["max"])
        if lo is not None and hi is not None:  # floats: min_max skips NaN unless all are
            entry[0], entry[1] = lo, hi
    return out, deferred


def _footer_bound(value: Any, physical: str) -> Any:
    """A bound as read from Parquet statistics in its stored form, or None if unusable."""
    if physical in ("FLOAT", "DOUBLE"):
        if not isinstance(value, float) or math.isnan(value):
            return None
        # The writer widens a zero bound to -0.0 (min) or 0.0 (max); both equal 0.0.
        return 0.0 if value == 0 else value
    if physical == "BOOLEAN":
        return value if isinstance(value, bool) else None
    if physical == "BYTE_ARRAY":
        return value if isinstance(value, str) and \
            len(value.encode()) < PARQUET_STRING_BOUND_BYTES else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def fill_deferred_bounds(chunks: Sequence[tuple[dict[str, list[Any]], int]],
                         deferred: Sequence[Sequence[tuple[str, str]]],
                         metadata: Any, schema: pa.Schema) -> None:
    """Set the bounds :func:`column_stats_deferring` left out of each chunk's stats (in place)
    from the Parquet ``metadata`` of the file the chunks (of ``schema``) were written to, in
    order (a chunk may span several row groups). A bound the file does not hold exactly, in
    the layout :func:`footer_layout` expects, stays unknown."""
    columns: dict[str, tuple[int, str, bool]] = {}  # name: (leaf index, physical type, raw)
    for i in range(metadata.num_columns):
        leaf = metadata.schema.column(i)
        if leaf.path not in schema.names:
            continue
        typ = schema.field(leaf.path).type
        layout = ("BYTE_ARRAY", None, False) if _is_string(typ) else footer_layout(typ)
        if layout is None or leaf.physical_type != layout[0]:
            continue
        if layout[1] is not None:
            unit = json.loads(leaf.logical_type.to_json()).get("timeUnit")
            if unit != layout[1]:
                continue
        columns[leaf.path] = (i, layout[0], layout[2])
    group = 0
    for (stats, rows), names in zip(chunks, deferred, strict=True):
        groups = []
        covered = 0
        while covered < rows and group < metadata.num_row_groups:
            groups.append(metadata.row_group(group))
            covered += groups[-1].num_rows
            group += 1
        if covered != rows:
            return  # not the layout written: leave the remaining bounds unknown
        for fid, name in names:
            column = columns.get(name)
            if column is None:
                continue
            index, physical, raw = column
            los: list[Any] = []
            his: list[Any] = []
            for row_group in groups:
                chunk = row_group.column(index)
                st = chunk.statistics
                # Only nulls here: no bounds needed (a chunk of one group has values, or its
                # column would not have been deferred).
                if len(groups) > 1 and (chunk.num_values == 0 or (
                        st is not None and st.has_null_count
                        and st.null_count == row_group.num_rows)):
                    continue
                if st is None or not st.has_min_max:
                    los = []
                    break
                lo = _footer_bound(st.min_raw if raw else st.min, physical)
                hi = _footer_bound(st.max_raw if raw else st.max, physical)
                if lo is None or hi is None:
                    los = []
                    break
                los.append(lo)
                his.append(hi)
            if los:
                # Strings bytewise, as min_max and Parquet compare UTF-8: code point order is
                # the same.
                stats[fid][0], stats[fid][1] = min(los), max(his)


def merge_stats(parts: Sequence[tuple[dict[str, list[Any]], int]],
                schema: pa.Schema) -> dict[str, Any]:
    """Combine the stats of consecutive chunks ``(stats, row_count)`` of one file (chunks of
    ``schema``, as :func:`column_stats` made them) into the file's stored statistics.

    Bounds are compared as values of their column's type: stored decimals are strings, and
    ``"10.00" < "9.50"`` as strings.
    """
    decimals = {str(field_id(f)) for f in schema if pa.types.is_decimal(f.type)}
    merged: dict[str, Any] = {STATS_VERSION_KEY: STATS_VERSION}
    for fid in parts[0][0] if parts else ():
        los, his, nulls, nans, unknown = [], [], 0, 0, False
        for stats, rows in parts:
            entry = stats[fid]
            lo, hi, n = entry[:3]
            nulls += n
            nans += entry[3] if len(entry) > 3 else 0
            if n == rows or (len(entry) > 3 and n + entry[3] == rows):
                continue  # only nulls (and NaN): no bounds, and none needed
            if lo is None or hi is None:
                unknown = True
            else:
                los.append(lo)
                his.append(hi)
        if unknown or not los:
            out = [None, None, nulls]
        elif fid in decimals:
            out = [min(los, key=Decimal), max(his, key=Decimal), nulls]
        else:
            out = [min(los), max(his), nulls]
        if len(parts[0][0][fid]) > 3:
            out.append(nans)
        merged[fid] = out
    return merged


@functools.lru_cache(maxsize=8192)
def parse_stats(text: str) -> dict[str, Any]:
    """A data file's stored statistics, parsed once: files are immutable, so planning reuses
    the parse across the steps of one plan and across scans. The result is shared: read it,
    never change it."""
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def stats_table(
    stats_json: Sequence[str], row_counts: pa.Array, schema: pa.Schema, columns: Sequence[str]
) -> pa.Table:
    """The stats of many files as one Arrow table, for vectorized pruning.

    Columns: ``row_count`` and, for each of ``columns``, ``min.<c>``, ``max.<c>``, ``nulls.<c>``
    and, for float columns, ``nans.<c>`` (null where unknown: statistics written before NaN
    was counted). Decimal bounds of statistics older than version 2 are null (unknown).
    """
    decoded = [parse_stats(s) if s else {} for s in stats_json]
    arrays: list[pa.Array] = [row_counts]
    names = ["row_count"]
    current: list[bool] | None = None
    for name in columns:
        field = schema.field(name)
        fid = str(field_id(field))
        triples = [d.get(fid) for d in decoded]
        lo = [t[0] if t else None for t in triples]
        hi = [t[1] if t else None for t in triples]
        nulls = [t[2] if t else None for t in triples]
        lo_arr, hi_arr = decode_values(lo, field.type), decode_values(hi, field.type)
        if pa.types.is_decimal(field.type):
            if current is None:
                current = [d.get(STATS_VERSION_KEY, 1) >= STATS_VERSION for d in decoded]
            trusted = pa.array(current, pa.bool_())
            lo_arr = pc.if_else(trusted, lo_arr, pa.scalar(None, field.type))
            hi_arr = pc.if_else(trusted, hi_arr, pa.scalar(None, field.type))
        arrays += [lo_arr, hi_arr, pa.array(nulls, type=pa.int64())]
        names += [f"min.{name}", f"max.{name}", f"nulls.{name}"]
        if pa.types.is_floating(field.type):
            arrays.append(pa.array([t[3] if t and len(t) > 3 else None for t in triples],
                                   type=pa.int64()))
            names.append(f"nans.{name}")
    return pa.Table.from_arrays(arrays, names=names)


# -- partitions -------------------------------------------------------------------------------


#: The longest directory name a partition column gets; longer ones (values of some 250 bytes
#: and more) are named by a hash of the value, since file systems limit a name to 255 bytes.
MAX_PARTITION_SEGMENT = 255
# Characters of a long value kept in front of its hash, to keep directories recognizable.
_HASHED_PREFIX_BYTES = 48


def partition_path(names: Sequence[str], values: Sequence[Any]) -> str:
    """Hive-style directory for partition values: ``day=2026-11-01/region=eu``.

    Distinct values get distinct directories (the metastore knows a partition by its path): a
    null is :data:`NULL_PARTITION`, and a value whose directory name would exceed
    :data:`MAX_PARTITION_SEGMENT` bytes is named ``<its first characters>=<160 bits of its
    SHA-256, in hex>`` (the value is kept whole in the metastore). ``quote`` never writes
    parentheses, nor a raw ``=`` after the first, so these names meet no plain value.
    """
    parts = []
    for name, value in zip(names, values, strict=True):
        key = quote(name, safe="")
        if value is None:
            text = NULL_PARTITION
        else:
            raw = str(value)
            text = quote(raw, safe="")
            if len(key) + 1 + len(text) > MAX_PARTITION_SEGMENT:
                text = _hashed_segment(raw)
        parts.append(f"{key}={text}")
    return "/".join(parts)


def _hashed_segment(raw: str) -> str:
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    prefix = ""
    for ch in raw:  # whole characters only, up to the byte budget (one value, not per row)
        quoted = quote(ch, safe="")
        if len(prefix) + len(quoted) > _HASHED_PREFIX_BYTES:
            break
        prefix += quoted
    return f"{prefix}={digest}"


def partition_shown(value: pa.Scalar) -> Any:
    """A partition value as :func:`partition_path` names its directory: the Python value, or,
    for a temporal value that Python cannot hold (a timestamp past year 9999 in its zone, a
    date outside years 1-9999), its stored integer (the value in the column's unit, UTC):
    values that could not be written before, so no existing directory is named differently,
    and no Python value prints as a bare integer in such a column."""
    if not value.is_valid:
        return None
    try:
        return value.as_py()
    except (OverflowError, ValueError):
        return encode_partition_value(value)


def partition_display(typ: pa.DataType, value: Any) -> Any:
    """A human-readable form of an encoded partition value, for directory names."""
    if value is None:
        return None
    arr = decode_values([value], typ)
    return str(arr[0].as_py())


def parse_partition_path(path: str) -> dict[str, str]:
    """The directory values of a partition path, as text (a hashed long value stays hashed:
    the metastore's partition values are the source of truth)."""
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
