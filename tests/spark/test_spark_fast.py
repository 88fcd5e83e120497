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
    t = lake.create_table("s.k", SCHEMA, deletion_vectors=False, primary_key=["id"], buckets=4)
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
    t = lake.create_table("s.d", SCHEMA, deletion_vectors=False, primary_key=["id"], buckets=4)
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


# -- deletion-vector tables: Spark's reader drops the deleted positions --------------------

DV_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string()),
                       ("v", pa.int64())])


def dv_rows(ids, p, v):
    return pa.table({"id": list(ids), "p": [p] * len(ids), "v": [v] * len(ids)},
                    schema=DV_SCHEMA)


def no_data_source(plan):
    """A plan reading everything with Spark's Parquet reader, some files with vectors."""
    return (not plan.source and any(g.deletes for g in plan.parquet)
            and "0 files in 0 splits through the arrowlake data source" in plan.describe()
            and "deleted rows dropped by position" in plan.describe())


def test_deletion_vector_table_reads_through_spark_parquet_reader(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.dv", DV_SCHEMA, primary_key=["id"], buckets=3,
                          deletion_vectors=True)
    t.upsert(dv_rows(range(600), "a", 0))
    t.upsert(dv_rows(range(0, 600, 5), "b", 1))
    t.upsert(dv_rows(range(0, 900, 9), "c", 2))  # replaces rows of both earlier writes
    t.delete("id >= 550 and id < 560")
    t.delete(al.col("id").isin([3, 4, 700]))
    plan = als.plan_read(spark, lake, "s.dv")
    assert no_data_source(plan) and "NOT IN list" in plan.describe(), plan.describe()
    assert frame_rows(als.read(spark, lake, "s.dv")) == as_spark_rows(t.to_arrow())
    assert als.read(spark, lake, "s.dv").count() == t.count() == 621
    query = "v >= 1 and id < 800"
    assert no_data_source(als.plan_read(spark, lake, "s.dv", filter=query, columns=["v", "id"]))
    picked = als.read(spark, lake, "s.dv", filter=query, columns=["v", "id"])
    assert picked.columns == ["v", "id"]
    assert frame_rows(picked, "id") == as_spark_rows(t.scan(query, ["v", "id"]).to_arrow(), "id")


def test_deletion_vectors_in_puffin_files_and_files_split_by_spark(spark, tmp_path,
                                                                  monkeypatch):
    """Vectors over the inline limit (kept in Puffin files), dropped by a bitmap and, for
    reads over more rows, by an anti-join; small row groups and partitions make Spark read
    each file in several tasks, whose row positions must still be the file's."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.big", DV_SCHEMA, primary_key=["id"], buckets=2,
                          deletion_vectors=True, properties={"write.row-group-rows": "4096"})
    n = 50_000
    t.upsert(dv_rows(range(n), "a", 0))
    t.upsert(dv_rows(range(0, n, 7), "b", 1))
    expected = as_spark_rows(t.to_arrow(), "id")
    key = "spark.sql.files.maxPartitionBytes"
    spark.conf.set(key, "4096")  # the files are about 12 KiB
    try:
        for method, bitmap_bytes in (("bitmap", als.fast.BITMAP_BYTES), ("anti-join", 0)):
            monkeypatch.setattr(als.fast, "BITMAP_BYTES", bitmap_bytes)
            monkeypatch.setattr(als.fast, "BITMAP_MAX_BYTES", bitmap_bytes)
            plan = als.plan_read(spark, lake, "s.big")
            assert no_data_source(plan) and method in plan.describe(), plan.describe()
            deletes = [d for g in plan.parquet if (d := g.deletes)]
            vectors = [f.vector for d in deletes for f in d.files if f.vector is not None]
            assert vectors and all(v.path is not None for v in vectors)  # Puffin
            fast = als.read(spark, lake, "s.big")
            assert fast.rdd.getNumPartitions() > len(t.files())
            assert frame_rows(fast, "id") == expected
            replaced = als.read(spark, lake, "s.big", filter="p = 'b'", columns=["id"])
            assert sorted(r.id for r in replaced.collect()) == list(range(0, n, 7))
    finally:
        spark.conf.unset(key)


def test_partitioned_deletion_vector_table_with_files_of_equal_size(spark, tmp_path):
    """Files of equal size cannot be told apart by ``_metadata.file_size``: each goes to its
    own read. The two partitions here hold the same keys and values, so their files are the
    same size."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.part", DV_SCHEMA, primary_key=["id", "p"], partition_by=["p"],
                          buckets=1, deletion_vectors=True)
    t.upsert(pa.concat_tables([dv_rows(range(300), p, 0) for p in ("a", "b")]))
    t.upsert(pa.concat_tables([dv_rows(range(0, 300, 6), p, 1) for p in ("a", "b")]))
    t.delete("p = 'b' and id < 12")
    plan = als.plan_read(spark, lake, "s.part")
    assert no_data_source(plan), plan.describe()
    first = t.files().filter(pa.compute.field("added_snapshot") == 1)["file_size"].to_pylist()
    assert len(first) == 2 and first[0] == first[1]
    assert len([g for g in plan.parquet if g.deletes]) == 2
    assert frame_rows(als.read(spark, lake, "s.part")) == as_spark_rows(t.to_arrow())
    query = "p = 'b' and id >= 100"  # partition a pruned
    pruned = als.plan_read(spark, lake, "s.part", filter=query)
    assert no_data_source(pruned) and sum(len(g.paths) for g in pruned.parquet) == 2
    assert frame_rows(als.read(spark, lake, "s.part", filter=query)) == \
        as_spark_rows(t.scan(query).to_arrow())


def test_deletion_vector_table_with_columns_named_like_spark_metadata(spark, tmp_path):
    """Columns named ``_metadata`` (Spark's hidden column) or like the row-key column the
    read adds do not get in the way of either."""
    lake = al.connect(tmp_path / "lake")
    schema = pa.schema([pa.field("_metadata", pa.int64(), nullable=False),
                        ("_arrowlake_row", pa.string())])
    t = lake.create_table("s.names", schema, primary_key=["_metadata"], deletion_vectors=True)
    t.upsert({"_metadata": list(range(20)), "_arrowlake_row": ["a"] * 20})
    t.upsert({"_metadata": [2, 5, 30], "_arrowlake_row": ["b"] * 3})
    assert no_data_source(als.plan_read(spark, lake, "s.names"))
    assert frame_rows(als.read(spark, lake, "s.names")) == as_spark_rows(t.to_arrow())
