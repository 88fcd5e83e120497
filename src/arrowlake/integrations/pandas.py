"""pandas in: a DataFrame → a table in one call (:meth:`arrowlake.Lake.from_pandas`).

When a table is created from a DataFrame, the pandas dtype of each column that Arrow cannot
express by its type alone (nullable integers, categoricals, ...) is kept in the field's
metadata; :func:`arrowlake.pandas_arrow.arrow_to_pandas` restores it when a scan is read into
pandas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowlake.errors import SchemaMismatch, ValidationError
from arrowlake.pandas_arrow import pandas_to_arrow
from arrowlake.schema import PANDAS_DTYPE_KEY, normalize_schema
from arrowlake.table.writes import append_parts

if TYPE_CHECKING:
    import pandas as pd


def _dtype_name(dtype: Any) -> str | None:
    name = str(dtype)
    if name in ("Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
                "Float32", "Float64", "boolean", "category"):
        return name
    return None


def infer_schema(df: pd.DataFrame, schema: Any = None) -> pa.Schema:
    """The table schema for ``df``: ``schema`` may be None (inferred), a ``pa.Schema`` (used as
    is), a list of column names (types inferred), or a list of Arrow types (names from ``df``).
    """
    if isinstance(schema, pa.Schema):
        return schema
    sample = pandas_to_arrow(df.iloc[:1000])
    if schema is None:
        inferred = sample.schema
    elif isinstance(schema, Sequence) and all(isinstance(s, str) for s in schema):
        if len(schema) != len(df.columns):
            raise SchemaMismatch(
                f"{len(schema)} column names given for a DataFrame of {len(df.columns)} "
                "columns")
        inferred = sample.schema
        inferred = pa.schema([inferred.field(i).with_name(name)
                              for i, name in enumerate(schema)])
    elif isinstance(schema, Sequence) and all(isinstance(s, pa.DataType) for s in schema):
        if len(schema) != len(df.columns):
            raise SchemaMismatch(
                f"{len(schema)} types given for a DataFrame of {len(df.columns)} columns")
        inferred = pa.schema([pa.field(str(name), typ) for name, typ in
                              zip(df.columns, schema, strict=True)])
    else:
        raise ValidationError(
            "schema must be None, a pyarrow.Schema, a list of column names or a list of "
            f"pyarrow types; got {type(schema).__name__}")
    fields = []
    for i, field in enumerate(inferred):
        dtype = _dtype_name(df.dtypes.iloc[i]) if i < len(df.columns) else None
        if dtype is not None:
            meta = dict(field.metadata or {})
            meta[PANDAS_DTYPE_KEY] = dtype.encode()
            field = field.with_metadata(meta)
        fields.append(field)
    return normalize_schema(pa.schema(fields))


def rename_for_schema(df: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """``df`` with its columns renamed positionally to ``schema``'s names where they differ."""
    if list(map(str, df.columns)) == schema.names[: len(df.columns)]:
        return df
    if len(df.columns) != len(schema):
        return df
    return df.set_axis(schema.names, axis=1)


def from_pandas(lake: Any, name: str, df: pd.DataFrame, *, schema: Any = None,
                splits_num: int | None = None, **create_table_options: Any) -> Any:
    """Create table ``name`` from ``df`` (see :meth:`arrowlake.Lake.from_pandas`)."""
    import os

    if splits_num is None:
        splits_num = os.cpu_count() or 1
    if splits_num < 1:
        raise ValidationError(f"splits_num must be at least 1, got {splits_num}")
    table_schema = infer_schema(df, schema)
    df = rename_for_schema(df, table_schema)
    table = lake.create_table(name, table_schema, **create_table_options)
    try:
        if len(df) and table.primary_key:
            # Rows of a key table are laid out by bucket, one sorted run each.
            table.upsert(df)
        elif len(df):
            # One file per split: the target size is set so that no split is cut again.
            data = pandas_to_arrow(df)
            n = len(df)
            step = -(-n // splits_num)
            parts = [data.slice(i, step) for i in range(0, n, step)]
            append_parts(table, parts)
    except BaseException:
        lake.drop_table(name, purge=True)
        raise
    return table
