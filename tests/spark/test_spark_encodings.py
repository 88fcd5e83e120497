"""Files written with BYTE_STREAM_SPLIT floats (``write.encodings = byte-stream-split``, and
arrowlake's default until it stopped) read on every Spark we claim: Spark's Parquet reader
decodes them from 4.3; before, arrowlake.spark.read sends them through the data source.
tests/spark/test_spark_lowest.py runs this file on PySpark 4.1 as well."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from tests.spark.helpers import as_spark_rows, frame_rows

pytest.importorskip("pyspark")

import arrowlake.spark as als
from arrowlake.spark.fast import SPLIT_FLOATS_SPARK
from arrowlake.spark.session import spark_version

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.float32()),
                    ("s", pa.string())])
NAN = float("nan")


def rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    x = [[1.5, NAN, -0.0, None, float("inf")][i % 5] for i in ids]
    return pa.table({"id": ids, "x": x, "y": x, "s": [f"s{i}" for i in ids]}, schema=SCHEMA)


def split_floats(path: str) -> bool:
    metadata = pq.ParquetFile(path.removeprefix("file://")).metadata
    return any("BYTE_STREAM_SPLIT" in metadata.row_group(g).column(c).encodings
               for g in range(metadata.num_row_groups) for c in range(metadata.num_columns))


def test_byte_stream_split_files_read_on_every_spark(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.old", SCHEMA, properties={"write.encodings": "byte-stream-split"})
    t.append(rows(0, 50))                                   # an old file: floats split
    t.set_properties(**{"write.encodings": "auto"})
    t.append(rows(50, 50))                                  # a new one: floats plain
    assert sorted(split_floats(p) for p in t.files()["path"].to_pylist()) == [False, True]
    plan = als.plan_read(spark, lake, "s.old")
    if spark_version(spark) >= SPLIT_FLOATS_SPARK:
        assert not plan.source and sum(len(g.paths) for g in plan.parquet) == 2
    else:  # the old file through arrowlake's reader, the new one through Spark's
        assert sum(len(g.paths) for g in plan.parquet) == 1
        assert sum(len(s.files) for s in plan.source) == 1
        assert "BYTE_STREAM_SPLIT" in plan.describe()
    assert frame_rows(als.read(spark, lake, "s.old"), "id") == as_spark_rows(t.to_arrow(), "id")
    # Without a float column the old file is Spark's to read on every version.
    assert not als.plan_read(spark, lake, "s.old", columns=["id", "s"]).source
    picked = als.read(spark, lake, "s.old", filter="x > 1 or y != 1.5", columns=["id"])
    assert sorted(r["id"] for r in picked.collect()) == sorted(
        t.scan(filter="x > 1 or y != 1.5", columns=["id"]).to_arrow()["id"].to_pylist())


def test_deleted_rows_of_byte_stream_split_files_stay_deleted(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.dv", SCHEMA, primary_key=["id"], buckets=2,
                          deletion_vectors=True,
                          properties={"write.encodings": "byte-stream-split"})
    t.upsert(rows(0, 60))
    t.set_properties(**{"write.encodings": "auto"})
    t.upsert(rows(10, 5).set_column(3, "s", pa.array(["new"] * 5)))
    t.delete("id >= 50")
    assert frame_rows(als.read(spark, lake, "s.dv"), "id") == as_spark_rows(t.to_arrow(), "id")
    assert len(als.read(spark, lake, "s.dv").collect()) == 50
