"""Structured Streaming: spark.readStream / writeStream .format("arrowlake")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

from arrowlake.spark.stream import ADMISSION_CONTROL

#: Tests that need read limits (maxSnapshotsPerTrigger, ...) or consumers, which PySpark 4.1
#: lacks for Python stream readers (tests/spark/test_spark_lowest.py runs this file there).
needs_pyspark_42 = pytest.mark.skipif(
    not ADMISSION_CONTROL, reason="PySpark 4.1: no read limits for Python stream readers")

ORDERS = pa.schema([("order_id", pa.int64()), ("day", pa.string()), ("amount", pa.int64())])


@pytest.fixture
def lake_path(tmp_path):
    return tmp_path / "lake"


def orders(ids, day="d1", amount=1):
    return pa.table({"order_id": list(ids), "day": [day] * len(ids),
                     "amount": [amount] * len(ids)}, ORDERS)


def source(spark, lake_path, name, **options):
    reader = spark.readStream.format("arrowlake").option("lake", str(lake_path))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load(name)


def collect_batches(df, checkpoint):
    """Run ``df`` with trigger(availableNow=True); its micro-batches as lists of row dicts."""
    batches: dict[int, list[dict]] = {}

    def keep(batch_df, batch_id):
        batches[batch_id] = [r.asDict() for r in batch_df.collect()]

    query = (df.writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    return [batches[k] for k in sorted(batches)]


KIND_ORDER = {"-D": 0, "-U": 1, "+U": 2, "+I": 3}


def by_id(rows):
    return sorted(rows, key=lambda r: (r["order_id"], KIND_ORDER[r["_row_kind"]]))


@needs_pyspark_42
def test_stream_reads_full_state_then_each_snapshot_with_row_kinds(spark, lake_path, tmp_path):
    lake = al.connect(lake_path)
    # No inline compaction: every snapshot below is a write, one batch each.
    t = lake.create_table("shop.orders", ORDERS, primary_key=["order_id"],
                          changelog_producer="lookup", properties={"compaction.mode": "off"})
    t.upsert(orders(range(3)))
    t.upsert(orders([1], amount=5))          # snapshot 2: the full state includes it
    df = source(spark, lake_path, "shop.orders", includeRowKind="true",
                maxSnapshotsPerTrigger=1)
    assert df.schema.fieldNames() == ["order_id", "day", "amount", "_row_kind"]
    ck = tmp_path / "ck"
    [first] = collect_batches(df, ck)
    assert by_id(first) == [
        {"order_id": 0, "day": "d1", "amount": 1, "_row_kind": "+I"},
        {"order_id": 1, "day": "d1", "amount": 5, "_row_kind": "+I"},
        {"order_id": 2, "day": "d1", "amount": 1, "_row_kind": "+I"}]
    t.upsert(orders([2], amount=7))          # snapshot 3
    t.delete("order_id = 0")                 # snapshot 4
    t.upsert(orders([9]))                    # snapshot 5
    # Restarted from the checkpoint: exactly the three later snapshots, one per batch.
    batches = collect_batches(source(spark, lake_path, "shop.orders", includeRowKind="true",
                                     maxSnapshotsPerTrigger=1), ck)
    assert [by_id(b) for b in batches] == [
        [{"order_id": 2, "day": "d1", "amount": 1, "_row_kind": "-U"},
         {"order_id": 2, "day": "d1", "amount": 7, "_row_kind": "+U"}],
        [{"order_id": 0, "day": "d1", "amount": 1, "_row_kind": "-D"}],
        [{"order_id": 9, "day": "d1", "amount": 1, "_row_kind": "+I"}]]


@needs_pyspark_42
def test_admission_control_and_starting_snapshot(spark, lake_path, tmp_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.log", ORDERS)
    for n in range(5):                       # snapshots 1..5, 10 rows each
        t.append(orders(range(n * 10, n * 10 + 10)))
    rows = collect_batches(source(spark, lake_path, "shop.log", startingSnapshot="earliest",
                                  maxRowsPerTrigger=25), tmp_path / "a")
    assert [len(b) for b in rows] == [20, 20, 10]
    rows = collect_batches(source(spark, lake_path, "shop.log", startingSnapshot=4),
                           tmp_path / "b")
    assert [sorted(r["order_id"] for r in b) for b in rows] == [list(range(30, 50))]
    rows = collect_batches(source(spark, lake_path, "shop.log", startingSnapshot="latest"),
                           tmp_path / "c")
    assert sum(len(b) for b in rows) == 0


@needs_pyspark_42
def test_consumer_progress_is_committed_to_the_metastore(spark, lake_path, tmp_path):
    lake = al.connect(lake_path)
    t = lake.create_table("shop.log", ORDERS)
    t.append(orders(range(3)))
    t.append(orders(range(3, 6)))
    collect_batches(source(spark, lake_path, "shop.log", consumer="spark-agg",
                           startingSnapshot="earliest"), tmp_path / "ck")
    [entry] = t.consumers().to_pylist()
    assert entry["consumer"] == "spark-agg" and entry["next_snapshot"] == 3
    t.append(orders(range(6, 8)))
    # A new query (no checkpoint) with the same consumer resumes after its progress.
    [batch] = collect_batches(source(spark, lake_path, "shop.log", consumer="spark-agg"),
                              tmp_path / "ck2")
    assert sorted(r["order_id"] for r in batch) == [6, 7]


def sink(df, lake_path, name, checkpoint, mode="append"):
    query = (df.writeStream.format("arrowlake").option("lake", str(lake_path))
             .option("checkpointLocation", str(checkpoint)).outputMode(mode)
             .trigger(availableNow=True).start(name))
    query.awaitTermination(120)
    assert query.exception() is None


def test_a_batch_spark_replays_after_a_crash_is_committed_once(spark, lake_path, tmp_path):
    """The crash window: the sink committed batch N, Spark died before recording it in the
    checkpoint's commit log. Removing that record makes Spark replay batch N on restart."""
    lake = al.connect(lake_path)
    src = lake.create_table("shop.log", ORDERS)
    out = lake.create_table("shop.copy", ORDERS)   # an append table: a replay would duplicate
    src.append(orders(range(4)))
    ck = tmp_path / "ck"
    sink(source(spark, lake_path, "shop.log"), lake_path, "shop.copy", ck)
    src.append(orders(range(4, 6)))
    sink(source(spark, lake_path, "shop.log"), lake_path, "shop.copy", ck)
    assert out.count() == 6 and out.current_snapshot_id == 2
    commits = sorted((ck / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    crc = ck / "commits" / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    sink(source(spark, lake_path, "shop.log"), lake_path, "shop.copy", ck)
    assert out.count() == 6 and out.current_snapshot_id == 2
    assert sorted(out.to_arrow().column("order_id").to_pylist()) == list(range(6))
    assert last.exists()                     # Spark did run the batch again


def test_update_mode_aggregation_upserts_into_a_primary_key_table(spark, lake_path, tmp_path):
    from pyspark.sql import functions as F

    from arrowlake.spark import foreach_batch_sink

    lake = al.connect(lake_path)
    src = lake.create_table("shop.orders", ORDERS, primary_key=["order_id"],
                            changelog_producer="lookup")
    totals = lake.create_table("shop.daily_totals",
                               pa.schema([("day", pa.string()), ("total", pa.int64())]),
                               primary_key=["day"])
    src.upsert(pa.concat_tables([orders(range(3), "d1", 10), orders(range(3, 5), "d2", 1)]))

    def run():
        df = source(spark, lake_path, "shop.orders", includeRowKind="true")
        signed = F.when(F.col("_row_kind").isin("-U", "-D"), -F.col("amount")) \
            .otherwise(F.col("amount"))
        agg = df.groupBy("day").agg(F.sum(signed).alias("total"))
        query = (agg.writeStream.outputMode("update")
                 .foreachBatch(foreach_batch_sink(str(lake_path), "shop.daily_totals"))
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert sorted(totals.to_arrow().to_pylist(), key=lambda r: r["day"]) == [
        {"day": "d1", "total": 30}, {"day": "d2", "total": 2}]
    src.upsert(orders([0], "d1", 4))          # d1: 30 - 10 + 4
    src.delete("order_id = 4")                # d2: 2 - 1
    run()
    assert sorted(totals.to_arrow().to_pylist(), key=lambda r: r["day"]) == [
        {"day": "d1", "total": 24}, {"day": "d2", "total": 1}]
    # Each batch is one commit with the query's id (a replay would be skipped by it).
    assert all(s["commit_id"].startswith("spark-stream:") for s in totals.history()
               if s["kind"] != "compact")


def test_complete_mode_overwrites_the_sink_each_batch(spark, lake_path, tmp_path):
    from pyspark.sql import functions as F

    lake = al.connect(lake_path)
    src = lake.create_table("shop.log", ORDERS)
    totals = lake.create_table("shop.totals",
                               pa.schema([("day", pa.string()), ("total", pa.int64())]))
    src.append(orders(range(3), "d1", 10))
    agg = source(spark, lake_path, "shop.log").groupBy("day").agg(
        F.sum("amount").alias("total"))
    sink(agg, lake_path, "shop.totals", tmp_path / "ck", mode="complete")
    src.append(orders(range(3, 5), "d2", 1))
    agg = source(spark, lake_path, "shop.log").groupBy("day").agg(
        F.sum("amount").alias("total"))
    sink(agg, lake_path, "shop.totals", tmp_path / "ck", mode="complete")
    assert sorted(totals.to_arrow().to_pylist(), key=lambda r: r["day"]) == [
        {"day": "d1", "total": 30}, {"day": "d2", "total": 2}]


def test_changes_from_a_stream_are_applied_to_a_primary_key_sink(spark, lake_path, tmp_path):
    lake = al.connect(lake_path)
    src = lake.create_table("shop.orders", ORDERS, primary_key=["order_id"],
                            changelog_producer="lookup")
    copy = lake.create_table("shop.mirror", ORDERS, primary_key=["order_id"])
    src.upsert(orders(range(5)))
    ck = tmp_path / "ck"

    def run():
        sink(source(spark, lake_path, "shop.orders", includeRowKind="true"), lake_path,
             "shop.mirror", ck)

    run()
    src.delete("order_id < 2")
    src.upsert(orders([3], amount=8))
    run()
    assert copy.to_arrow().sort_by("order_id").equals(src.to_arrow().sort_by("order_id"))
    assert sorted(copy.to_arrow().column("order_id").to_pylist()) == [2, 3, 4]
    shutil.rmtree(ck)


KILLED_QUERY = '''
import os, sys
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
lake, checkpoint = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
query = (spark.readStream.format("arrowlake").option("lake", lake)
         .option("startingSnapshot", "earliest").option("maxSnapshotsPerTrigger", "1")
         .load("shop.log").writeStream.format("arrowlake").option("lake", lake)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
         .start("shop.copy"))
query.awaitTermination()
'''


# slow: a driver killed and started again, about 40 s.
@pytest.mark.slow
@needs_pyspark_42
def test_a_query_killed_and_restarted_from_its_checkpoint_writes_every_row_once(
        spark, lake_path, tmp_path):
    """A query in its own process (own local Spark) is SIGKILLed mid-run, then restarted from
    its checkpoint here: the sink holds every source row exactly once."""
    lake = al.connect(lake_path)
    src = lake.create_table("shop.log", ORDERS)
    out = lake.create_table("shop.copy", ORDERS)       # an append table: no dedup by key
    for n in range(20):                                 # 20 snapshots, one batch each
        src.append(orders(range(n * 5, n * 5 + 5)))
    ck = tmp_path / "ck"
    script = tmp_path / "query.py"
    script.write_text(KILLED_QUERY)
    proc = subprocess.Popen([sys.executable, str(script), str(lake_path), str(ck)],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while out.count() < 15 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            out.refresh()
        assert 15 <= out.count() < 100, "the query should be killed mid-run"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)             # the driver and its JVM, at once
        proc.wait()
    src.append(orders(range(100, 105)))
    sink(source(spark, lake_path, "shop.log", startingSnapshot="earliest",
                maxSnapshotsPerTrigger=50), lake_path, "shop.copy", ck)
    ids = sorted(out.to_arrow().column("order_id").to_pylist())
    assert ids == list(range(105))


@needs_pyspark_42
def test_streams_prune_by_the_filter_option_and_read_only_the_columns_asked_for(
        spark, lake_path, tmp_path):
    """As batch reads: ``filter`` prunes each change's files (a partition whose file is gone
    is never opened) and drops the rows it does not match; ``columns`` are all that is read."""
    lake = al.connect(lake_path)
    t = lake.create_table("shop.parts", ORDERS, partition_by=["day"])
    t.append(pa.concat_tables([orders(range(3), "d1", 1), orders(range(3, 6), "d1", 5),
                               orders(range(6, 9), "d2", 5)]))
    options = dict(filter="day = 'd1' and amount > 1", columns="amount,order_id",
                   includeRowKind="true")
    df = source(spark, lake_path, "shop.parts", **options)
    assert df.schema.fieldNames() == ["amount", "order_id", "_row_kind"]
    ck = tmp_path / "ck"
    [first] = collect_batches(df, ck)
    assert sorted(r["order_id"] for r in first) == [3, 4, 5]
    t.append(pa.concat_tables([orders([10], "d1", 9), orders([11], "d1", 0),
                               orders([12], "d2", 9)]))
    t.delete("order_id = 4")
    # The d2 files are gone: a read that opened them would fail, a pruned read never does.
    for path in t.files().column("path").to_pylist():
        if "/day=d2/" in path:  # (a file name may hold "d2" too)
            os.remove(path.removeprefix("file://"))
    batches = collect_batches(source(spark, lake_path, "shop.parts", maxSnapshotsPerTrigger=1,
                                     **options), ck)
    assert [sorted((r["order_id"], r["amount"], r["_row_kind"]) for r in b)
            for b in batches] == [[(10, 9, "+I")], [(4, 5, "-D")]]
    with pytest.raises(Exception, match="cannot be read"):  # unfiltered, they are opened
        collect_batches(source(spark, lake_path, "shop.parts", columns="order_id"),
                        tmp_path / "unfiltered")


def test_streams_without_read_limits_and_what_pyspark_41_refuses(spark, lake_path, tmp_path):
    """What every PySpark we claim does: the first batch is the table, each later run reads
    what was committed since, a restart from the checkpoint reads nothing twice. Where
    PySpark gives Python stream readers no read limits (4.1), the options that need them are
    refused saying so, when the query starts."""
    lake = al.connect(lake_path)
    t = lake.create_table("shop.orders", ORDERS, primary_key=["order_id"])
    t.upsert(orders(range(3)))
    t.upsert(orders([1], amount=5))
    ck = tmp_path / "ck"
    df = source(spark, lake_path, "shop.orders", includeRowKind="true")
    [first] = collect_batches(df, ck)
    assert by_id(first) == [
        {"order_id": 0, "day": "d1", "amount": 1, "_row_kind": "+I"},
        {"order_id": 1, "day": "d1", "amount": 5, "_row_kind": "+I"},
        {"order_id": 2, "day": "d1", "amount": 1, "_row_kind": "+I"}]
    assert collect_batches(df, ck) == []              # nothing new: no batch
    t.upsert(orders([2], amount=7))
    t.delete("order_id = 0")
    later = [r for b in collect_batches(df, ck) for r in b]
    assert by_id(later) == [
        {"order_id": 0, "day": "d1", "amount": 1, "_row_kind": "-D"},
        {"order_id": 2, "day": "d1", "amount": 1, "_row_kind": "-U"},
        {"order_id": 2, "day": "d1", "amount": 7, "_row_kind": "+U"}]
    if ADMISSION_CONTROL:
        return
    for option, message in (("maxSnapshotsPerTrigger", "need PySpark 4.2 or later"),
                            ("maxRowsPerTrigger", "need PySpark 4.2 or later"),
                            ("consumer", "Option consumer needs PySpark 4.2 or later")):
        with pytest.raises(Exception, match=message):
            collect_batches(source(spark, lake_path, "shop.orders", **{option: "2"}),
                            tmp_path / option)
