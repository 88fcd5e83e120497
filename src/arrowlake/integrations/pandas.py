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
import pyarrow.compute as pc

from arrowlake.errors import SchemaMismatch, ValidationError
from arrowlake.metastore.inflight import registered_write
from arrowlake.pandas_arrow import pandas_to_arrow
from arrowlake.schema import PANDAS_DTYPE_KEY, normalize_schema
from arrowlake.table.writes.plain import append_parts

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


def _first_changed(natural: pa.Array, typ: pa.DataType) -> Any:
    """A value of ``natural`` that does not survive a conversion to ``typ`` and back (None if
    every value does, or the conversion is not possible at all)."""
    try:
        back = natural.cast(typ, safe=False).cast(natural.type, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    changed = pc.fill_null(pc.not_equal(back, natural), False)
    if pa.types.is_floating(natural.type):
        changed = pc.and_(changed, pc.invert(pc.and_(pc.is_nan(back), pc.is_nan(natural))))
    where = pc.index(changed, True).as_py()
    return None if where < 0 else natural[where].as_py()


def _why(value: Any, typ: pa.DataType) -> str:
    if pa.types.is_integer(typ) and isinstance(value, float) and not value.is_integer():
        return "is not a whole number"
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return f"is out of the range of {typ}"
    if pa.types.is_timestamp(typ) or pa.types.is_time(typ) or pa.types.is_duration(typ):
        return f"needs a finer unit than {typ}"
    return f"cannot be represented in {typ}"


def _natural(series: Any) -> pa.Array:
    arr = pa.Array.from_pandas(series)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _does_not_fit(name: str, typ: pa.DataType, value: Any, reason: str) -> SchemaMismatch:
    shown = "" if value is None else f" value {value!r}"
    return SchemaMismatch(
        f"Column '{name}' of the DataFrame does not fit the requested type {typ}:{shown} "
        f"{reason}. Request a type that holds every value, or fix the data")


def convert_column(name: str, series: Any, typ: pa.DataType) -> pa.Array:
    """``series`` as an Arrow array of the user-requested ``typ``, converted as
    ``pa.Array.from_pandas(series, type=typ)`` does (NaN and None become nulls) but never
    silently wrong: a value that would be truncated, wrap around, overflow to infinity or lose
    decimal digits raises :class:`SchemaMismatch` naming the column, the type and the value.
    """
    try:
        arr = pa.Array.from_pandas(series, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as direct:
        # Some conversions pandas -> Arrow has no direct path for (float -> decimal,
        # categorical -> another type): convert as inferred, then cast checking each value.
        natural = _natural(series)
        try:
            arr = natural.cast(typ, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            value = _first_changed(natural, typ)
            reason = _why(value, typ) if value is not None else str(direct).split("\n", 1)[0]
            raise _does_not_fit(name, typ, value, reason) from None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        # Arrow's safe casts let finite floats become infinite (float32) and floats lose
        # digits (decimal): both are checked here.
        natural = _natural(series)
        if pa.types.is_floating(natural.type):
            if pa.types.is_floating(typ):
                lost = pc.and_(pc.is_inf(arr), pc.invert(pc.is_inf(natural)))
                reason = f"is out of the range of {typ}"
            else:
                lost = pc.not_equal(arr.cast(natural.type), natural)
                reason = "would lose digits"
            where = pc.index(pc.fill_null(lost, False), True).as_py()
            if where >= 0:
                raise _does_not_fit(name, typ, natural[where].as_py(), reason)
    return arr


def convert_frame(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``df`` as an Arrow table with the types of the user-given ``schema`` (columns matched by
    name; columns the schema lacks are converted as inferred, and rejected when written)."""
    arrays, fields = [], []
    for column in df.columns:
        name = str(column)
        i = schema.get_field_index(name)
        if i < 0:
            arrays.append(_natural(df[column]))
            fields.append(pa.field(name, arrays[-1].type))
            continue
        field = schema.field(i)
        arrays.append(convert_column(name, df[column], field.type))
        fields.append(field)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def rename_for_schema(df: pd.DataFrame, schema: pa.Schema, *,
                      by_name: bool = False) -> pd.DataFrame:
    """``df`` with its columns renamed positionally to ``schema``'s names where they differ;
    with ``by_name`` (a full schema the user gave), columns that all carry names of the schema
    keep them, in any order."""
    names = list(map(str, df.columns))
    if names == schema.names[: len(df.columns)] or (by_name and set(names) <= set(schema.names)):
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
    df = rename_for_schema(df, table_schema, by_name=isinstance(schema, pa.Schema))
    given_types = isinstance(schema, pa.Schema) or (
        isinstance(schema, Sequence) and any(isinstance(s, pa.DataType) for s in schema))
    # Types the user gave are an explicit request: the data is converted to them before the
    # table exists, so a value that does not fit leaves nothing behind.
    converted = convert_frame(df, table_schema) if given_types and len(df) else None
    table = lake.create_table(name, table_schema, **create_table_options)
    try:
        if len(df) and table.primary_key:
            # Rows of a key table are laid out by bucket, one sorted run each.
            table.upsert(df if converted is None else converted)
        elif len(df):
            # One file per split: the target size is set so that no split is cut again.
            data = pandas_to_arrow(df) if converted is None else converted
            n = len(df)
            step = -(-n // splits_num)
            parts = [data.slice(i, step) for i in range(0, n, step)]
            with registered_write(table.state.metastore, table.state.table_id, "append"):
                append_parts(table.state, parts)
    except BaseException as failure:
        try:
            lake.drop_table(name, purge=True)
        except Exception as cleanup:  # the write's error stays the one raised
            failure.add_note(
                f"Removing the table '{name}' this call had created also failed "
                f"({type(cleanup).__name__}: {cleanup}); once storage and metastore are "
                f"reachable, lake.drop_table({name!r}, purge=True) removes what is left.")
        raise
    return table
