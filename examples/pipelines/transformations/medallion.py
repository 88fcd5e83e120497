"""bronze -> silver (CDC) -> gold, every dataset an arrowlake table in the default lake.

``spark-pipelines run`` imports this file with ``spark`` set (a Spark Connect session). Each
dataset lands as the arrowlake table ``default.<name>`` (Spark's current database) of the lake
named by ``$ARROWLAKE_LAKE``:

- ``bronze_orders``, ``bronze_customers``: the raw CSV / JSON-lines events as they are (append
  tables);
- ``silver_orders``, ``silver_customers``: the events applied as changes to primary-key tables
  (``_row_kind`` from ``op``: deletes delete; ``sequence_field="seq"`` keeps the latest event
  per key, whatever order a batch holds them in);
- ``gold_daily_totals``: per day, the total amount and the number of live orders, kept by an
  aggregating primary-key table (``merge_engine="aggregation"``) from silver's changes with
  signs (``-U``/``-D`` subtract);
- ``audit.order_deletes``: a sink (``dp.create_sink`` + ``@dp.append_flow``) naming its table.

PySpark hands the writer neither ``table_properties`` nor a primary key, so the tables that
need one are created here, with arrowlake, before the flows run.
"""

import os
from pathlib import Path

import pyarrow as pa
from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from arrowlake.lake import lake_address

spark: SparkSession  # set by spark-pipelines when it imports this file

RAW = Path(os.environ.get("PIPELINE_RAW", "raw")).resolve()
ORDER_DDL = "seq long, op string, order_id long, customer_id long, day string, amount long"
CUSTOMER_DDL = "seq long, op string, customer_id long, name string, region string"

lake = lake_address().connect()
# Every flow's query is analysed when the pipeline starts, reads of tables included: the tables
# that flows read exist before the first run (a table nothing reads would be created by its
# writer from the flow's schema).
ORDER_EVENTS = pa.schema([("seq", pa.int64()), ("op", pa.string()), ("order_id", pa.int64()),
                          ("customer_id", pa.int64()), ("day", pa.string()),
                          ("amount", pa.int64())])
lake.create_table("default.bronze_orders", ORDER_EVENTS, exist_ok=True)
lake.create_table("default.bronze_customers", pa.schema([
    ("seq", pa.int64()), ("op", pa.string()), ("customer_id", pa.int64()), ("name", pa.string()),
    ("region", pa.string())]), exist_ok=True)
lake.create_table("audit.order_deletes", ORDER_EVENTS, exist_ok=True)
lake.create_table("default.silver_orders", pa.schema([
    ("order_id", pa.int64()), ("customer_id", pa.int64()), ("day", pa.string()),
    ("amount", pa.int64()), ("seq", pa.int64())]), primary_key="order_id",
    sequence_field="seq", changelog_producer="lookup", exist_ok=True)
lake.create_table("default.silver_customers", pa.schema([
    ("customer_id", pa.int64()), ("name", pa.string()), ("region", pa.string()),
    ("seq", pa.int64())]), primary_key="customer_id", sequence_field="seq", exist_ok=True)
lake.create_table("default.gold_daily_totals", pa.schema([
    ("day", pa.string()), ("total", pa.int64()), ("orders", pa.int64())]),
    primary_key="day", merge_engine="aggregation",
    aggregations={"total": "sum", "orders": "sum"}, exist_ok=True)
lake.close()


# -- bronze: raw files as they are ---------------------------------------------------------


@dp.table(format="arrowlake", table_properties={"write.target-file-size": "64m"})
def bronze_orders():
    return (spark.readStream.format("csv").option("header", "true").schema(ORDER_DDL)
            .load(str(RAW / "orders")))


@dp.table(format="arrowlake")
def bronze_customers():
    return spark.readStream.format("json").schema(CUSTOMER_DDL).load(str(RAW / "customers"))


# -- silver: events applied as changes -------------------------------------------------------


def as_changes(events, columns):
    kind = (F.when(F.col("op") == "delete", "-D").when(F.col("op") == "insert", "+I")
            .otherwise("+U"))
    return events.select(*columns, "seq", kind.alias("_row_kind"))


@dp.table(format="arrowlake")
def silver_orders():
    bronze = spark.readStream.format("arrowlake").load("default.bronze_orders")
    return as_changes(bronze, ["order_id", "customer_id", "day", "amount"])


@dp.table(format="arrowlake")
def silver_customers():
    bronze = spark.readStream.format("arrowlake").load("default.bronze_customers")
    return as_changes(bronze, ["customer_id", "name", "region"])


# -- gold: signed changes summed by the table ----------------------------------------------


@dp.table(format="arrowlake")
def gold_daily_totals():
    changes = (spark.readStream.format("arrowlake").option("includeRowKind", "true")
               .load("default.silver_orders"))
    sign = F.when(F.col("_row_kind").isin("-U", "-D"), -1).otherwise(1)
    return changes.select("day", (sign * F.col("amount")).alias("total"),
                          sign.cast("long").alias("orders"))


# -- a sink: the table is named by its options -----------------------------------------------

dp.create_sink("order_deletes", format="arrowlake", options={"path": "audit.order_deletes"})


@dp.append_flow(target="order_deletes")
def deleted_orders():
    return (spark.readStream.format("csv").option("header", "true").schema(ORDER_DDL)
            .load(str(RAW / "orders")).where("op = 'delete'"))
