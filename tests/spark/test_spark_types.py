"""The Arrow -> Spark type mapping, directly (Spark itself is checked in test_spark_read)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql import types as st

from arrowlake.spark.types import (
    spark_arrow_schema,
    spark_schema,
    spark_type,
    to_spark_batch,
)

CASES = [
    (pa.int8(), st.ByteType()), (pa.int16(), st.ShortType()), (pa.int32(), st.IntegerType()),
    (pa.int64(), st.LongType()), (pa.uint8(), st.ShortType()), (pa.uint16(), st.IntegerType()),
    (pa.uint32(), st.LongType()), (pa.uint64(), st.DecimalType(20, 0)),
    (pa.float16(), st.FloatType()), (pa.float32(), st.FloatType()),
    (pa.float64(), st.DoubleType()), (pa.bool_(), st.BooleanType()),
    (pa.string(), st.StringType()), (pa.large_string(), st.StringType()),
    (pa.string_view(), st.StringType()), (pa.binary(), st.BinaryType()),
    (pa.large_binary(), st.BinaryType()), (pa.binary(4), st.BinaryType()),
    (pa.date32(), st.DateType()), (pa.date64(), st.DateType()),
    (pa.timestamp("ns"), st.TimestampNTZType()), (pa.timestamp("s"), st.TimestampNTZType()),
    (pa.timestamp("ms", tz="America/New_York"), st.TimestampType()),
    (pa.time64("us"), st.TimeType(6)), (pa.duration("ms"), st.DayTimeIntervalType(0, 3)),
    (pa.decimal128(38, 10), st.DecimalType(38, 10)), (pa.decimal256(50, 2), st.StringType()),
    (pa.large_list(pa.int32()), st.ArrayType(st.IntegerType(), True)),
    (pa.list_(pa.uint8(), 3), st.ArrayType(st.ShortType(), True)),
    (pa.struct([("a", pa.large_string())]),
     st.StructType([st.StructField("a", st.StringType(), True)])),
    (pa.map_(pa.string(), pa.float64()), st.MapType(st.StringType(), st.DoubleType(), True)),
    (pa.dictionary(pa.int32(), pa.string()), st.StringType()), (pa.null(), st.NullType()),
]


@pytest.mark.parametrize(("arrow", "spark"), CASES, ids=[str(c[0]) for c in CASES])
def test_every_table_type_maps_to_a_spark_type(arrow, spark):
    assert spark_type(arrow) == spark


def test_batches_are_cast_to_exactly_what_spark_accepts_without_losing_values():
    batch = pa.record_batch({
        "u64": pa.array([2**64 - 1, None], pa.uint64()),
        "u8": pa.array([255, 0], pa.uint8()),
        "ns": pa.array([1_000_001_999, None], pa.timestamp("ns")),
        "zoned": pa.array([datetime(2026, 1, 1, 12, tzinfo=UTC)] * 2,
                          pa.timestamp("s", tz="Asia/Tokyo")),
        "big": pa.array([Decimal("12345678901234567890123456789012345678901.5"), None],
                        pa.decimal256(60, 1)),
        "words": pa.array(["a", None], pa.large_string()),
        "dict": pa.array(["x", "x"]).dictionary_encode(),
        "t": pa.array([time(1, 2, 3, 4), None], pa.time64("us")),
        "d": pa.array([timedelta(seconds=1, microseconds=5), None], pa.duration("ns")),
        "day": pa.array([date(2026, 11, 1), None], pa.date64()),
        "nested": pa.array([{"xs": [1, 2], "m": [("k", 1)]}, None], pa.struct([
            ("xs", pa.large_list(pa.uint16())), ("m", pa.map_(pa.large_string(), pa.uint8()))])),
    })
    target = spark_arrow_schema(spark_schema(batch.schema))
    out = to_spark_batch(batch, target)
    assert out.schema.equals(target)
    rows = out.to_pylist()
    assert rows[0]["u64"] == Decimal(2**64 - 1) and rows[0]["u8"] == 255
    assert rows[0]["ns"] == datetime(1970, 1, 1, 0, 0, 1, 1)  # truncated to microseconds
    assert rows[0]["zoned"] == datetime(2026, 1, 1, 12, tzinfo=UTC)  # the same instant
    assert out.schema.field("zoned").type == pa.timestamp("us", tz="UTC")
    assert rows[0]["big"] == "12345678901234567890123456789012345678901.5"
    assert rows[0]["words"] == "a" and rows[1]["dict"] == "x"
    assert rows[0]["t"] == time(1, 2, 3, 4)
    assert rows[0]["d"] == timedelta(seconds=1, microseconds=5)
    assert rows[0]["day"] == date(2026, 11, 1)
    assert rows[0]["nested"] == {"xs": [1, 2], "m": [("k", 1)]}
    assert rows[1]["nested"] is None


def test_non_nullable_key_columns_stay_non_nullable():
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), ("v", pa.string())])
    spark = spark_schema(schema)
    assert [f.nullable for f in spark.fields] == [False, True]
    batch = pa.record_batch({"id": pa.array([1], pa.int32()), "v": ["a"]})
    assert to_spark_batch(batch, spark_arrow_schema(spark)).schema.field("id").nullable is False
