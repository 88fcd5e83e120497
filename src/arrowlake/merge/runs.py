"""Runs: the data files of primary-key tables, as writers, readers and compaction share them.

A run is a Parquet file of one partition and bucket, sorted by key with unique keys, holding the
table's columns and an int8 row-kind column (:data:`KIND_COLUMN`). The metastore keeps each
run's key range (``key_min``/``key_max``, JSON of :func:`key_json`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.io.stats import encode_scalar
from arrowlake.schema import FIELD_ID_KEY

#: The row-kind column as stored in data files of primary-key tables.
KIND_COLUMN = "_al_row_kind"
#: Its field id: far above any id a user schema reaches, and never assigned to user columns.
KIND_FIELD_ID = 2_000_000_000
KIND_FIELD = pa.field(KIND_COLUMN, pa.int8(), nullable=False,
                      metadata={FIELD_ID_KEY: str(KIND_FIELD_ID).encode()})

ROW_KIND_NAMES = ("+I", "-U", "+U", "-D")


def run_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a table's runs: its columns and the row-kind column."""
    return schema.append(KIND_FIELD)


def key_json(row: pa.Table, key: Sequence[str]) -> str:
    """The key of ``row`` (a one-row table) as stored for a run's key range."""
    return json.dumps([encode_scalar(row.column(k)[0]) for k in key], separators=(",", ":"))


def key_bounds_compare(key_types: Sequence[pa.DataType]) -> bool:
    """Whether stored key bounds of these types order in Python as the Arrow values do: ints for
    integers and temporals, str for strings (code-point order of str is the byte order of
    UTF-8). Only then can two runs' key ranges be compared without reading the runs."""
    t = pa.types
    return all(t.is_integer(typ) or t.is_date(typ) or t.is_timestamp(typ) or t.is_time(typ)
               or t.is_duration(typ) or t.is_string(typ) or t.is_large_string(typ)
               or t.is_string_view(typ) for typ in key_types)


def key_range(low: str | None, high: str | None
              ) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """A run's stored key bounds as comparable tuples, or None when a bound is missing or holds
    a null. Callers check :func:`key_bounds_compare` for the key's types first."""
    if low is None or high is None:
        return None
    lo, hi = _key_values(low), _key_values(high)
    if None in lo or None in hi:
        return None
    return lo, hi


@functools.lru_cache(maxsize=16384)
def _key_values(text: str) -> tuple[Any, ...]:
    """A stored key bound, parsed once (runs are immutable)."""
    return tuple(json.loads(text))


def row_kinds_from(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Row kinds given as strings (``+I -U +U -D``) or integers (0..3) as int8 codes."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        raise ValidationError(f"The row-kind column has {column.null_count} null values")
    if pa.types.is_integer(column.type):
        codes = column.cast(pa.int8(), safe=False)
        bad = pc.sum(pc.or_(pc.less(column, 0), pc.greater(column, 3))).as_py() or 0
    elif (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
          or pa.types.is_string_view(column.type)):
        idx = pc.index_in(column.cast(pa.string()), value_set=pa.array(ROW_KIND_NAMES))
        bad = idx.null_count
        codes = pc.fill_null(idx, 0).cast(pa.int8())
    else:
        raise ValidationError(
            f"The row-kind column must hold strings (+I, -U, +U, -D) or int8 codes 0-3, not "
            f"{column.type}")
    if bad:
        raise ValidationError(
            f"{bad} rows have an unknown row kind; allowed are +I, -U, +U, -D (or 0-3)")
    return codes
