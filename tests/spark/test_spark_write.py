"""Batch writes through df.write.format("arrowlake"): every mode, one atomic commit."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

import arrowlake as al
from tests.conftest import stored_paths

pytest.importorskip("pyspark")

USERS = pa.schema([("user_id", pa.int64()), ("region", pa.string()), ("email", pa.string()),
                   ("visits", pa.int32())])
DDL = "user_id long, region string, email string, visits int"


def write(df, lake_path, name, mode="append", **options):
    w = df.write.format("arrowlake").option("lake", str(lake_path)).mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    w.save(name)


def frame(spark, rows, partitions=2):
    return spark.createDataFrame(rows, DDL).repartition(partitions)


def in_partitions(spark, *parts):
    """A DataFrame whose partition i holds exactly the rows parts[i]."""
    rdd = spark.sparkContext.parallelize([list(p) for p in parts], len(parts))
    df = spark.createDataFrame(rdd.flatMap(lambda rows: rows), DDL)
    assert df.rdd.glom().map(len).collect() == [len(p) for p in parts]
    return df


def rows_of(table):
    return sorted(table.to_arrow().to_pylist(), key=lambda r: r["user_id"])


@pytest.fixture
def lake_path(tmp_path):
    return tmp_path / "lake"


def test_append_commits_every_task_in_one_snapshot(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.visits", USERS, partition_by=["region"])
    rows = [(i, "eu" if i % 2 else "us", f"u{i}@x", i) for i in range(200)]
    write(frame(spark, rows, 4), lake_path, "crm.visits")
    assert t.current_snapshot_id == 1
    assert len(t.history()) == 1
    assert [tuple(r.values()) for r in rows_of(t)] == rows
    write(frame(spark, rows[:10], 2), lake_path, "crm.visits")
    assert t.count() == 210 and t.current_snapshot_id == 2


def test_overwrite_replaces_the_table_or_the_rows_replace_where_selects(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.visits", USERS, partition_by=["region"])
    t.append(pa.table({"user_id": [1, 2, 3], "region": ["eu", "us", "eu"],
                       "email": ["a", "b", "c"], "visits": [1, 2, 3]}, schema=USERS))
    write(frame(spark, [(10, "eu", "x", 0)], 1), lake_path, "crm.visits", "overwrite",
          replaceWhere="region = 'eu'")
    assert [(r["user_id"], r["region"]) for r in rows_of(t)] == [(2, "us"), (10, "eu")]
    write(frame(spark, [(20, "us", "y", 0), (21, "eu", "z", 1)], 2), lake_path, "crm.visits",
          "overwrite")
    assert [r["user_id"] for r in rows_of(t)] == [20, 21]
    assert t.history()[-1]["kind"] == "overwrite"


def test_upsert_from_many_tasks_resolves_a_repeated_key_by_task_order(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.users", USERS, primary_key=["user_id"], buckets=2)
    t.upsert(pa.table({"user_id": [1, 2, 3], "region": ["eu"] * 3, "email": ["old"] * 3,
                       "visits": [0, 0, 0]}, schema=USERS))
    # Two partitions, both holding key 2: the later partition's version wins, as if the
    # DataFrame's rows were upserted in order.
    df = in_partitions(spark, [(2, "eu", "first", 1), (4, "us", "new", 1)],
                       [(2, "eu", "second", 2), (5, "us", "new", 1)])
    write(df, lake_path, "crm.users", write="upsert")
    got = {r["user_id"]: r["email"] for r in rows_of(t)}
    assert got == {1: "old", 2: "second", 3: "old", 4: "new", 5: "new"}
    assert [s["kind"] for s in t.history() if s["kind"] != "compact"] == ["upsert", "upsert"]
    # mode("append") on a primary-key table is an upsert too.
    write(frame(spark, [(1, "eu", "again", 5)], 1), lake_path, "crm.users")
    assert {r["user_id"]: r["email"] for r in rows_of(t)}[1] == "again"


def test_changes_apply_row_kinds(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.users", USERS, primary_key=["user_id"], buckets=2)
    t.upsert(pa.table({"user_id": [1, 2, 3], "region": ["eu"] * 3, "email": ["old"] * 3,
                       "visits": [0, 0, 0]}, schema=USERS))
    changes = spark.createDataFrame(
        [(1, "eu", "new", 1, "+U"), (2, "eu", "old", 0, "-D"), (7, "us", "ins", 1, "+I")],
        DDL + ", op string").repartition(2)
    write(changes, lake_path, "crm.users", write="changes")
    assert {r["user_id"]: r["email"] for r in rows_of(t)} == {1: "new", 3: "old", 7: "ins"}
    assert [s["kind"] for s in t.history() if s["kind"] != "compact"][-1] == "changes"


def test_primary_key_overwrite_of_a_partition(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.users", USERS, primary_key=["user_id", "region"],
                          partition_by=["region"], buckets=2)
    t.upsert(pa.table({"user_id": [1, 2, 3], "region": ["eu", "us", "eu"],
                       "email": ["a", "b", "c"], "visits": [0, 0, 0]}, schema=USERS))
    write(frame(spark, [(9, "eu", "n", 0)], 1), lake_path, "crm.users", "overwrite",
          replaceWhere="region = 'eu'")
    assert [(r["user_id"], r["region"]) for r in rows_of(t)] == [(2, "us"), (9, "eu")]


def test_a_failed_write_leaves_the_table_and_its_files_unchanged(spark, lake_path):
    lake = al.connect(lake_path)
    t = lake.create_table("crm.users", USERS, primary_key=["user_id"], buckets=2)
    t.upsert(pa.table({"user_id": [1], "region": ["eu"], "email": ["a"], "visits": [0]},
                      schema=USERS))
    before_files = stored_paths(t)
    before_rows = rows_of(t)
    # One task writes its runs, the other fails (a null key): nothing is committed. Files of
    # tasks that reported before the job was aborted are deleted then; a task Spark cut off
    # after it wrote never reports its files, which orphan cleanup removes.
    df = in_partitions(spark, [(i, "eu", "x", 1) for i in range(100)], [(None, "eu", "x", 1)])
    with pytest.raises(Exception, match="not nullable"):
        write(df, lake_path, "crm.users")
    assert t.current_snapshot_id == 1
    assert rows_of(t) == before_rows
    t.remove_orphan_files(older_than=timedelta(0), dry_run=False)
    assert stored_paths(t) == before_files


def test_write_errors_name_what_to_fix(spark, lake_path):
    lake = al.connect(lake_path)
    lake.create_table("crm.visits", USERS)
    one = frame(spark, [(1, "eu", "a", 1)], 1)
    with pytest.raises(Exception, match="needs a table with a primary key"):
        write(one, lake_path, "crm.visits", write="upsert")
    with pytest.raises(Exception, match="do not match the overwrite filter"):
        write(one, lake_path, "crm.visits", "overwrite", replaceWhere="region = 'us'")
    assert lake.table("crm.visits").current_snapshot_id is None


def test_a_table_of_every_type_round_trips_through_spark(spark, lake_path):
    from tests.spark.helpers import all_types_data, as_spark_rows, frame_rows

    lake = al.connect(lake_path)
    data = all_types_data()
    t = lake.create_table("t.types", data.schema)
    t.append(data)
    df = spark.read.format("arrowlake").option("lake", str(lake_path)).load("t.types")
    before = frame_rows(df, "id")
    write(df, lake_path, "t.types")  # Spark's types go back into the table's
    assert t.count() == 2 * data.num_rows
    assert t.to_arrow().schema == t.schema
    doubled = as_spark_rows(t.to_arrow(), "id")
    assert doubled[::2] == before and doubled[1::2] == before
