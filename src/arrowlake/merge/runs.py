"""Runs: the data files of primary-key tables, as writers, readers and compaction share them.

A run is a Parquet file of one partition and bucket, sorted by key with unique keys, holding the
table's columns and an int8 row-kind column (:data:`KIND_COLUMN`). The metastore keeps each
run's key range (``key_min``/``key_max``, JSON of :func:`key_json`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

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
