"""Arrow types as Spark sees them: one mapping for every type a table can hold.

Spark accepts from a Python source only the Arrow types its own types convert to (it rejects
int32 for a long, large strings, unsigned integers, non-UTC or nanosecond timestamps, ...).
:func:`spark_type` maps a table's Arrow type to the Spark type, :func:`spark_schema` a whole
schema, and :func:`to_spark_batch` casts a batch to exactly what Spark expects:

==================================  ===========================================================
Arrow                               Spark (and the Arrow values handed to it)
==================================  ===========================================================
int8/16/32/64                       Byte/Short/Integer/LongType
uint8/16/32                         the next wider signed type (Short/Integer/LongType)
uint64                              DecimalType(20, 0)
float16/32, float64                 FloatType, DoubleType
bool                                BooleanType
string, large_string, string_view   StringType (int32 offsets)
binary, large_binary, binary_view,  BinaryType
fixed_size_binary
date32, date64                      DateType
timestamp with a zone, any unit     TimestampType, microseconds in UTC
timestamp without a zone            TimestampNTZType, microseconds
time32, time64                      TimeType(6)
duration                            DayTimeIntervalType, microseconds
decimal with precision <= 38        DecimalType(p, s)
decimal with precision > 38         StringType (Spark's decimals stop at 38 digits)
list, large_list, fixed_size_list,  ArrayType
list_view
struct, map                         StructType, MapType
dictionary                          its value type
null                                NullType
==================================  ===========================================================

Nanosecond timestamps, times and durations are truncated to microseconds, Spark's precision.
The functions of this module are shared by every reader and writer of the Spark integration.
"""

from __future__ import annotations

import inspect

import pyarrow as pa
from pyspark.sql import types as st
from pyspark.sql.pandas.types import to_arrow_schema

from arrowlake.errors import SchemaMismatch
from arrowlake.schema import can_write

#: Spark's decimals hold at most this many digits.
MAX_SPARK_PRECISION = 38


def spark_type(typ: pa.DataType) -> st.DataType:
    """The Spark type values of Arrow type ``typ`` are read as."""
    t = pa.types
    if t.is_dictionary(typ):
        return spark_type(typ.value_type)
    if t.is_boolean(typ):
        return st.BooleanType()
    if t.is_integer(typ):
        width = typ.bit_width + (8 if t.is_unsigned_integer(typ) else 0)
        if width <= 8:
            return st.ByteType()
        if width <= 16:
            return st.ShortType()
        if width <= 32:
            return st.IntegerType()
        if width <= 64:
            return st.LongType()
        return st.DecimalType(20, 0)
    if t.is_float16(typ) or t.is_float32(typ):
        return st.FloatType()
    if t.is_float64(typ):
        return st.DoubleType()
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return st.StringType()
    if (t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ)
            or t.is_fixed_size_binary(typ)):
        return st.BinaryType()
    if t.is_date(typ):
        return st.DateType()
    if t.is_timestamp(typ):
        return st.TimestampType() if typ.tz is not None else st.TimestampNTZType()
    if t.is_time(typ):
        return st.TimeType(6)
    if t.is_duration(typ):
        return st.DayTimeIntervalType(st.DayTimeIntervalType.DAY,
                                      st.DayTimeIntervalType.SECOND)
    if t.is_decimal(typ):
        if typ.precision > MAX_SPARK_PRECISION:
            return st.StringType()
        return st.DecimalType(typ.precision, typ.scale)
    if (t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ)
            or t.is_list_view(typ) or t.is_large_list_view(typ)):
        return st.ArrayType(spark_type(typ.value_type), typ.value_field.nullable)
    if t.is_struct(typ):
        return st.StructType([spark_field(typ.field(i)) for i in range(typ.num_fields)])
    if t.is_map(typ):
        return st.MapType(spark_type(typ.key_type), spark_type(typ.item_type),
                          typ.item_field.nullable)
    if t.is_null(typ):
        return st.NullType()
    raise SchemaMismatch(f"Arrow type {typ} has no Spark equivalent")


def spark_field(field: pa.Field) -> st.StructField:
    return st.StructField(field.name, spark_type(field.type), field.nullable)


def spark_schema(schema: pa.Schema) -> st.StructType:
    """The Spark schema of a table schema (field ids are not carried over)."""
    return st.StructType([spark_field(f) for f in schema])


#: PySpark 4.1's to_arrow_schema has ``timestamp_utc`` (UTC by default); 4.2+ has ``timezone``.
_ZONE_ARGUMENT = "timezone" in inspect.signature(to_arrow_schema).parameters


def spark_arrow_schema(schema: st.StructType) -> pa.Schema:
    """The Arrow schema Spark requires of batches of ``schema`` from a Python source."""
    if _ZONE_ARGUMENT:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)


def to_spark_batch(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast column by column to ``target`` (from :func:`spark_arrow_schema`).

    Lossy only where the table holds more than Spark can: sub-microsecond time is truncated.
    """
    if batch.schema.equals(target):
        return batch
    arrays = []
    for column, field in zip(batch.columns, target, strict=True):
        arrays.append(_cast(column, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _cast(arr: pa.Array, typ: pa.DataType) -> pa.Array:
    if arr.type == typ:
        return arr
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_float16(arr.type):
        arr = arr.cast(pa.float32())
    # safe=False only allows truncating sub-microsecond time: every other cast here widens.
    return arr.cast(typ, safe=False)


def from_spark_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` (from Spark) with the columns Spark holds in a wider type than the table
    (unsigned integers, float16, decimals over 38 digits as strings, nanosecond time, ...)
    cast back to the table's type, so a table read into Spark can be written back to it.

    A value that does not fit (an int32 over 65535 for a uint16 column) raises
    :class:`SchemaMismatch`; columns the table's own write rules accept are left for them.
    """
    arrays = list(batch.columns)
    changed = False
    for i, name in enumerate(batch.schema.names):
        index = schema.get_field_index(name)
        if index < 0:
            continue
        typ = schema.field(index).type
        have = batch.schema.field(i).type
        if have == typ or can_write(have, typ):
            continue
        if spark_arrow_schema(spark_schema(pa.schema([pa.field(name, typ)]))).field(0).type \
                != have:
            continue  # not Spark's image of the column: the table's write rules decide
        try:
            arrays[i] = arrays[i].cast(typ, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatch(
                f"Column '{name}' is {typ} in the table; Spark's {have} values do not fit it: "
                f"{exc}") from None
        changed = True
    if not changed:
        return batch
    fields = [pa.field(f.name, a.type, f.nullable) for f, a in zip(batch.schema, arrays,
                                                                     strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
