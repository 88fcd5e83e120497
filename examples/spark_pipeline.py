"""A medallion pipeline on local Spark: raw events -> bronze -> silver (CDC) -> gold -> pandas.

    python examples/spark_pipeline.py [--lake DIR] [--rounds 3] [--orders 200]
                                      [--remote sc://HOST:PORT]

``--remote`` runs it from a Spark Connect client against that server (which must see the
lake's directory and have arrowlake installed for its Python workers).

- raw: order events as CSV and customer events as JSON lines, written by a deterministic
  generator (examples/pipeline_events.py) in rounds, with updates and deletes;
- bronze: Spark file streams append the raw events as they are to ``bronze.orders`` and
  ``bronze.customers`` (append tables);
- silver: streams of the bronze tables apply each batch's events as changes (last event per key
  wins; deletes delete) to the primary-key tables ``silver.orders`` and ``silver.customers``
  (``changelog_producer="lookup"``: their changes carry exact before-images);
- gold: a streaming aggregation of silver's changes (``_row_kind``: ``-U``/``-D`` rows
  subtract) upserts per-day totals into the primary-key table ``gold.daily_totals``;
- finally gold is read back with pandas and compared with pandas over the raw events.

Every stream runs with ``trigger(availableNow=True)`` and a checkpoint after each round of
events, so each round is processed incrementally, exactly once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_events import (
    EventGenerator,
    check_gold,
    final_state,
    read_events,
    write_round,
)

import arrowlake as al
from arrowlake.spark import foreach_batch_sink

__all__ = ["final_state", "main", "read_events"]

ORDERS = pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()),
                    ("day", pa.string()), ("amount", pa.int64())])
CUSTOMERS = pa.schema([("customer_id", pa.int64()), ("name", pa.string()),
                       ("region", pa.string())])
EVENT = pa.schema([("seq", pa.int64()), ("op", pa.string())])
ORDER_DDL = "seq long, op string, order_id long, customer_id long, day string, amount long"
CUSTOMER_DDL = "seq long, op string, customer_id long, name string, region string"


def create_tables(lake: al.Lake) -> None:
    for name, schema, key in (("orders", ORDERS, "order_id"),
                              ("customers", CUSTOMERS, "customer_id")):
        lake.create_table(f"bronze.{name}", pa.schema([*EVENT, *schema]))
        lake.create_table(f"silver.{name}", schema, primary_key=[key],
                          changelog_producer="lookup")
    lake.create_table("gold.daily_totals",
                      pa.schema([("day", pa.string()), ("total", pa.int64()),
                                 ("orders", pa.int64())]), primary_key=["day"])


def run(query) -> None:
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def bronze(spark, lake: str, raw: Path, checkpoints: Path) -> None:
    """Raw files -> bronze append tables (the arrowlake streaming sink)."""
    for name, fmt, ddl in (("orders", "csv", ORDER_DDL), ("customers", "json", CUSTOMER_DDL)):
        reader = spark.readStream.format(fmt).schema(ddl)
        if fmt == "csv":
            reader = reader.option("header", "true")
        run(reader.load(str(raw / name)).writeStream.format("arrowlake").option("lake", lake)
            .option("checkpointLocation", str(checkpoints / f"bronze-{name}"))
            .trigger(availableNow=True).start(f"bronze.{name}"))


def silver(spark, lake: str, checkpoints: Path) -> None:
    """Bronze events -> silver primary-key tables, as changes (the last event per key)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    for name, key, schema in (("orders", "order_id", ORDERS),
                              ("customers", "customer_id", CUSTOMERS)):
        # queryId: the sink's commit ids name the query (Spark Connect cannot tell it the id).
        write = foreach_batch_sink(lake, f"silver.{name}", write="changes", rowKind="_kind",
                                   queryId=f"silver-{name}")

        def apply(batch_df, batch_id, key=key, schema=schema, write=write):
            last = Window.partitionBy(key).orderBy(F.col("seq").desc())
            latest = (batch_df.withColumn("_n", F.row_number().over(last))
                      .where("_n = 1")
                      .withColumn("_kind", F.when(F.col("op") == "delete", "-D")
                                  .when(F.col("op") == "insert", "+I").otherwise("+U")))
            write(latest.select(*schema.names, "_kind"), batch_id)

        stream = (spark.readStream.format("arrowlake").option("lake", lake)
                  .option("consumer", f"silver-{name}").load(f"bronze.{name}"))
        run(stream.writeStream.foreachBatch(apply)
            .option("checkpointLocation", str(checkpoints / f"silver-{name}"))
            .trigger(availableNow=True).start())


def gold(spark, lake: str, checkpoints: Path) -> None:
    """Silver order changes -> per-day totals, upserted into gold (update mode)."""
    from pyspark.sql import functions as F

    changes = (spark.readStream.format("arrowlake").option("lake", lake)
               .option("includeRowKind", "true").option("consumer", "gold-daily")
               .option("maxSnapshotsPerTrigger", "10").load("silver.orders"))
    sign = F.when(F.col("_row_kind").isin("-U", "-D"), -1).otherwise(1)
    totals = changes.groupBy("day").agg(F.sum(sign * F.col("amount")).alias("total"),
                                        F.sum(sign).cast("long").alias("orders"))
    run(totals.writeStream.outputMode("update")
        .foreachBatch(foreach_batch_sink(lake, "gold.daily_totals", queryId="gold-daily"))
        .option("checkpointLocation", str(checkpoints / "gold"))
        .trigger(availableNow=True).start())


def spark_session(remote: str | None = None):
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local[2]").appName("arrowlake-pipeline")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def main(argv: list[str] | None = None, spark=None) -> tuple[object, object]:
    """Run the pipeline; returns (gold read with pandas, the pandas computation)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", help="lake directory (default: a new temporary one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--orders", type=int, default=200, help="order events per round")
    parser.add_argument("--remote", help="a Spark Connect server, sc://host:port")
    args = parser.parse_args(argv)
    root = Path(args.lake or tempfile.mkdtemp(prefix="arrowlake-pipeline-"))
    lake_dir, raw, checkpoints = root / "lake", root / "raw", root / "checkpoints"
    lake = al.connect(lake_dir)
    create_tables(lake)
    spark = spark or spark_session(args.remote)
    events = EventGenerator()
    for n in range(args.rounds):
        write_round(raw, n, *events.round(args.orders))
        bronze(spark, str(lake_dir), raw, checkpoints)
        silver(spark, str(lake_dir), checkpoints)
        gold(spark, str(lake_dir), checkpoints)
    return check_gold(lake.table("gold.daily_totals").to_pandas(), raw, lake_dir)


if __name__ == "__main__":
    gold_df, expected_df = main()
    sys.exit(0 if gold_df.equals(expected_df) else 1)
