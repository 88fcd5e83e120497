"""arrowlake.spark.read: Spark's Parquet reader where no merge is needed, same rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import arrowlake as al
from tests.conftest import s3_warehouse
from tests.spark.helpers import all_types_data, as_spark_rows, frame_rows

pytest.importorskip("pyspark")

import arrowlake.spark as als

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("n", pa.int32())])


def data(start, n):
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "day": [f"d{i % 3}" for i in ids], "n": [i % 10 for i in ids]},
                    schema=SCHEMA)


def source(spark, lake_path, name):
    return spark.read.format("arrowlake").option("lake", str(lake_path)).load(name)


def test_append_table_with_evolved_schema_reads_the_same_as_the_data_source(spark, tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.t", SCHEMA, partition_by=["day"])
    t.append(data(0, 300))
    t.rename_column("n", "amount")
    t.alter_column("amount", pa.int64())
    t.add_column("note", pa.string())
    t.append(pa.table({"id": [1000], "day": ["d9"], "amount": [2**40], "note": ["x"]}))
    plan = als.plan_read(spark, lake, "s.t")
    assert not plan.source and sum(len(g.paths) for g in plan.parquet) == 4
    assert len(plan.parquet) == 2  # one read per schema version
    fast = als.read(spark, str(path), "s.t")
    assert fast.schema == source(spark, path, "s.t").schema
    expected = frame_rows(source(spark, path, "s.t"))
    assert frame_rows(fast) == expected == as_spark_rows(t.to_arrow())
    picked = als.read(spark, lake, "s.t", filter="amount >= 5 and day in ('d1', 'd9')",
                      columns=["note", "id"])
    assert picked.columns == ["note", "id"]
    assert frame_rows(picked, "id") == as_spark_rows(
        t.scan("amount >= 5 and day in ('d1', 'd9')", ["note", "id"]).to_arrow(), "id")


def test_primary_key_table_merges_only_overlapping_buckets(spark, tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=4)
    t.upsert(data(0, 400))
    t.upsert(data(0, 400).slice(0, 40).set_column(2, "n", pa.array([99] * 40, pa.int32())))
    t.delete("id = 7")
    plan = als.plan_read(spark, lake, "s.k")
    assert plan.source and "buckets whose runs must be merged" in plan.describe()
    fast = als.read(spark, lake, "s.k")
    assert frame_rows(fast) == frame_rows(source(spark, path, "s.k")) == \
        as_spark_rows(t.to_arrow())
    t.compact(full=True)
    plan = als.plan_read(spark, lake, "s.k")
    assert not plan.source  # after compaction nothing needs merging
    assert frame_rows(als.read(spark, lake, "s.k")) == as_spark_rows(t.to_arrow())


def test_buckets_of_disjoint_runs_take_spark_parquet_reader(spark, tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.d", SCHEMA, primary_key=["id"], buckets=4)
    t.upsert(data(0, 400))
    t.upsert(data(1000, 400))  # new keys only: every bucket gets a second run of other keys
    files = t.files()
    assert files.num_rows == 8
    plan = als.plan_read(spark, lake, "s.d")
    assert not plan.source, plan.describe()
    assert sum(len(g.paths) for g in plan.parquet) == 8
    assert frame_rows(als.read(spark, lake, "s.d")) == as_spark_rows(t.to_arrow())
    # A delete gives one bucket a run that must be merged; the other buckets stay direct.
    t.delete("id = 1001")
    plan = als.plan_read(spark, lake, "s.d")
    assert len(plan.source) == 1 and len(plan.source[0].files) == 3, plan.describe()
    assert sum(len(g.paths) for g in plan.parquet) == 6
    assert frame_rows(als.read(spark, lake, "s.d")) == as_spark_rows(t.to_arrow())


def test_types_spark_parquet_does_not_read_fall_back_to_the_data_source(spark, tmp_path):
    path = tmp_path / "lake"
    lake = al.connect(path)
    table = all_types_data()
    t = lake.create_table("s.types", table.schema)
    t.append(table)
    plan = als.plan_read(spark, lake, "s.types")
    assert plan.source and "column types" in plan.describe()
    ok_columns = ["id", "i8", "u16", "u64", "s", "ls", "b", "d32", "ts_ms", "ts_z", "dec",
                  "ints", "words", "point", "attrs"]
    plan = als.plan_read(spark, lake, "s.types", columns=ok_columns)
    assert not plan.source
    fast = als.read(spark, lake, "s.types", columns=ok_columns)
    assert frame_rows(fast, "id") == as_spark_rows(t.scan(columns=ok_columns).to_arrow(), "id")
    assert frame_rows(als.read(spark, lake, "s.types"), "id") == \
        as_spark_rows(t.to_arrow(), "id")


def test_storage_spark_cannot_reach_falls_back_to_the_data_source(spark, tmp_path, request):
    """A lake on the local S3 endpoint with the PostgreSQL metastore: the set-up of a real
    cluster. Spark here has no S3A, so the fast path reads through the data source."""
    warehouse, options = s3_warehouse(request)
    url = request.getfixturevalue("pg_server").create_database()
    lake = al.connect(url, warehouse=warehouse, storage_options=options)
    t = lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=2)
    t.upsert(data(0, 100))

    df = spark.createDataFrame([(i, f"d{i % 3}", i) for i in range(100, 140)],
                               "id long, day string, n int").repartition(2)
    (df.write.format("arrowlake").option("lake", url).option("warehouse", warehouse)
     .option("storageOptions", json.dumps(options)).mode("append").save("s.k"))
    assert t.count() == 140
    read = (spark.read.format("arrowlake").option("lake", url).option("warehouse", warehouse)
            .option("storageOptions", json.dumps(options)).load("s.k"))
    assert frame_rows(read) == as_spark_rows(t.to_arrow())
    t.compact(full=True)  # one run per bucket: only the storage keeps Spark's reader out
    plan = als.plan_read(spark, url, "s.k", warehouse=warehouse, storage_options=options)
    assert not plan.parquet and "storage Spark's reader cannot reach" in plan.describe()
    fast = als.read(spark, url, "s.k", warehouse=warehouse, storage_options=options)
    assert frame_rows(fast) == as_spark_rows(t.to_arrow())
