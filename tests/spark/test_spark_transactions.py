"""A streaming micro-batch fanned out to several tables in one lake transaction, exactly once
across restarts (arrowlake.spark.foreach_batch_transaction)."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

from arrowlake.spark.stream import ADMISSION_CONTROL

needs_pyspark_42 = pytest.mark.skipif(
    not ADMISSION_CONTROL, reason="PySpark 4.1: no read limits for Python stream readers")

EVENTS = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("amount", pa.int64())])
ORDERS = pa.schema([("id", pa.int64()), ("amount", pa.int64())])


def events(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "kind": ["order" if i % 2 == 0 else "line" for i in ids],
                     "amount": [i * 10 for i in ids]}, EVENTS)


def make_tables(lake: al.Lake) -> tuple[al.Table, al.Table, al.Table]:
    return (lake.create_table("shop.log", EVENTS),
            lake.create_table("shop.orders", ORDERS),  # append table: no dedup by key
            lake.create_table("shop.lines", ORDERS, primary_key=["id"], buckets=2))


def fan_out(batch, batch_id, tx):
    tx.write(batch.where("kind = 'order'").drop("kind"), "shop.orders")
    tx.write(batch.where("kind = 'line'").drop("kind"), "shop.lines", mode="upsert")


def test_each_batch_lands_in_every_table_in_one_transaction(spark, tmp_path) -> None:
    from arrowlake.spark import foreach_batch_transaction

    lake_path = tmp_path / "lake"
    lake = al.connect(lake_path)
    log, orders, lines = make_tables(lake)
    for n in range(3):
        log.append(events(range(n * 4, n * 4 + 4)))
    query = (spark.readStream.format("arrowlake").option("lake", str(lake_path))
             .option("startingSnapshot", "earliest").load("shop.log")
             .writeStream.foreachBatch(foreach_batch_transaction(str(lake_path), fan_out))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(orders.to_arrow().column("id").to_pylist()) == list(range(0, 12, 2))
    assert sorted(lines.to_arrow().column("id").to_pylist()) == list(range(1, 12, 2))
    # Every batch's snapshots of the two tables carry one transaction id; and the commit id.
    o = orders.snapshots().select(["transaction_id", "commit_id"]).to_pylist()
    li = lines.snapshots().select(["transaction_id", "commit_id"]).to_pylist()
    assert o == li and all(r["transaction_id"] for r in o)
    assert all(r["commit_id"].startswith("spark-stream:") for r in o)
    assert lake.metastore.live_writes() == []


KILLED_QUERY = '''
import os, sys
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from arrowlake.spark import foreach_batch_transaction
lake, checkpoint = sys.argv[1], sys.argv[2]
''' + inspect.getsource(fan_out) + '''
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
query = (spark.readStream.format("arrowlake").option("lake", lake)
         .option("startingSnapshot", "earliest").option("maxSnapshotsPerTrigger", "1")
         .load("shop.log").writeStream.foreachBatch(foreach_batch_transaction(lake, fan_out))
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
         .start())
query.awaitTermination()
'''


@pytest.mark.slow
@needs_pyspark_42
def test_a_query_killed_between_batches_writes_every_row_once_in_every_table(
        spark, tmp_path) -> None:
    """The query runs in a process of its own (own JVM), is SIGKILLed mid-run, then restarted
    from its checkpoint here: each table holds every row of its kind exactly once, and no
    batch is in one table without the other."""
    from arrowlake.spark import foreach_batch_transaction

    lake_path = tmp_path / "lake"
    lake = al.connect(lake_path)
    log, orders, lines = make_tables(lake)
    for n in range(20):  # 20 snapshots, one batch each
        log.append(events(range(n * 4, n * 4 + 4)))
    script = tmp_path / "query.py"
    script.write_text(KILLED_QUERY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(al.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), str(lake_path), str(tmp_path / "ck")],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while orders.refresh().count() < 12 and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.2)
        assert 12 <= orders.count() < 40, "the query should be killed mid-run"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, at once
        proc.wait()
    assert orders.refresh().count() == lines.refresh().count()  # never half a batch
    log.append(events(range(80, 84)))
    query = (spark.readStream.format("arrowlake").option("lake", str(lake_path))
             .option("startingSnapshot", "earliest").option("maxSnapshotsPerTrigger", "50")
             .load("shop.log").writeStream
             .foreachBatch(foreach_batch_transaction(str(lake_path), fan_out))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(orders.to_arrow().column("id").to_pylist()) == list(range(0, 84, 2))
    assert sorted(lines.to_arrow().column("id").to_pylist()) == list(range(1, 84, 2))
    o = orders.snapshots().column("transaction_id").to_pylist()
    li = lines.snapshots().column("transaction_id").to_pylist()
    assert o == li
