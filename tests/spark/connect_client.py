"""What the Spark Connect tests run in a client process of their own.

PySpark decides per process whether ``pyspark.sql.functions`` builds classic or Connect
columns (a Connect session sets ``SPARK_CONNECT_MODE_ENABLED`` for the whole process), so a
Connect client cannot share the test process with the classic session of the other Spark
tests. The tests call these functions in one spawned process that holds the Connect session,
as a user's program would; results come back as Arrow tables.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

spark: Any = None


def start(url: str) -> None:
    """The process's Connect session (``SparkSession.builder.remote``, as users create it)."""
    global spark
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()


def session_kind() -> tuple[str, bool]:
    """The session's class and what arrowlake tells of it."""
    from arrowlake.spark.session import is_connect

    return type(spark).__module__, is_connect(spark)


def fast_read(lake: str, table: str, limits: dict[str, int] | None = None,
              **kwargs: Any) -> tuple[pa.Table, str]:
    """``arrowlake.spark.read`` over Connect, and its plan's description. ``limits`` sets
    module constants of :mod:`arrowlake.spark.fast` for this read (which way deleted rows are
    dropped), as the classic tests' ``monkeypatch`` does."""
    import arrowlake.spark as als

    saved = {name: getattr(als.fast, name) for name in limits or {}}
    try:
        for name, value in (limits or {}).items():
            setattr(als.fast, name, value)
        plan = als.plan_read(spark, lake, table, **kwargs)  # what als.read(...) reads
        return plan.to_dataframe(spark).toArrow(), plan.describe()
    finally:
        for name, value in saved.items():
            setattr(als.fast, name, value)


def parallelism() -> int:
    from arrowlake.spark.session import default_parallelism

    return default_parallelism(spark)


def register() -> None:
    import arrowlake.spark as als

    als.register(spark)


def format_read(lake: str, table: str, **options: str) -> pa.Table:
    reader = spark.read.format("arrowlake").option("lake", lake)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(table).toArrow()


def format_write(lake: str, table: str, data: pa.Table, mode: str = "append",
                 **options: str) -> None:
    writer = spark.createDataFrame(data).write.format("arrowlake").option("lake", lake)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode(mode).save(table)


def stream_copy(lake: str, source: str, target: str, checkpoint: str) -> None:
    """A streaming query from one table into another, up to what is committed now."""
    query = (spark.readStream.format("arrowlake").option("lake", lake).load(source)
             .writeStream.format("arrowlake").option("lake", lake)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True)
             .start(target))
    query.awaitTermination()


def stream_totals(lake: str, source: str, target: str, checkpoint: str, query_id: str
                  ) -> None:
    """Per ``day`` sums of ``n`` in update mode through ``foreach_batch_sink``."""
    from pyspark.sql import functions as F

    from arrowlake.spark import foreach_batch_sink

    query = (spark.readStream.format("arrowlake").option("lake", lake).load(source)
             .groupBy("day").agg(F.sum("n").alias("total"))
             .writeStream.outputMode("update")
             .foreachBatch(foreach_batch_sink(lake, target, queryId=query_id))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()


def sink_without_query_id(lake: str, target: str, data: pa.Table) -> str:
    """What ``foreach_batch_sink`` without ``queryId`` says when handed a batch of a Connect
    session (as ``foreachBatch`` hands it one on the server)."""
    from arrowlake.spark import foreach_batch_sink

    try:
        foreach_batch_sink(lake, target)(spark.createDataFrame(data), 0)
    except Exception as e:  # its text crosses processes whatever its class
        return f"{type(e).__name__}: {e}"
    return "no error"


def jvm_classes(names: list[str]) -> tuple[bool, dict[str, bool]]:
    """Whether the server has S3A (``has_s3a``), and each of ``names`` (``has_class``)."""
    from arrowlake.spark.s3a import has_s3a
    from arrowlake.spark.session import has_class

    return has_s3a(spark), {name: has_class(spark, name) for name in names}
