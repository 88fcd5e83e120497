"""Jobs the cluster's driver runs for tests/cluster (called as ``job(spark, *args)``). Each
returns plain data; the tests compare it with what arrowlake reads in the test process."""

from __future__ import annotations

import contextlib
import io
import json
import urllib.request
from datetime import timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

import arrowlake.spark


def _rows(df: DataFrame) -> list[dict]:
    return sorted(df.toArrow().to_pylist(), key=repr)


def _frame(spark: SparkSession, rows: list[dict], schema: pa.Schema) -> DataFrame:
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema))


def executors(spark: SparkSession) -> list[str]:
    """The executors' ids (the driver not counted)."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds()
    return sorted(str(ids.apply(i)) for i in range(ids.size()))


def write_then_read(spark: SparkSession, lake: dict, table: str, rows: list[dict],
                    schema: pa.Schema, mode: str = "append", write: str = "append") -> dict:
    """A batch write through the data source, then reads through it and the fast path."""
    (_frame(spark, rows, schema).repartition(2).write.format("arrowlake")
     .options(**lake["options"]).option("write", write).mode(mode).save(table))
    source = spark.read.format("arrowlake").options(**lake["options"]).load(table)
    kwargs = {"warehouse": lake["warehouse"], "storage_options": lake["storage"]}
    plan = arrowlake.spark.plan_read(spark, lake["uri"], table, **kwargs)
    fast = arrowlake.spark.read(spark, lake["uri"], table, **kwargs)
    return {"source": _rows(source), "fast": _rows(fast), "plan": plan.describe()}


def stream_copy(spark: SparkSession, lake: dict, source: str, sink: str,
                checkpoint: str) -> int:
    """Everything new in ``source`` appended to ``sink`` (availableNow), from ``checkpoint``;
    the number of micro-batches run."""
    query = (spark.readStream.format("arrowlake").options(**lake["options"]).load(source)
             .writeStream.format("arrowlake").options(**lake["options"])
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(sink))
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def compact(spark: SparkSession, lake: dict, table: str, full: bool) -> Any:
    return arrowlake.spark.compact(spark, lake["uri"], table, full=full,
                                   warehouse=lake["warehouse"], storage_options=lake["storage"])


def remove_orphans(spark: SparkSession, lake: dict, table: str, dry_run: bool) -> Any:
    return arrowlake.spark.remove_orphan_files(
        spark, lake["uri"], table, timedelta(0), dry_run, warehouse=lake["warehouse"],
        storage_options=lake["storage"])


def plan_texts(spark: SparkSession, lake: dict, table: str) -> dict:
    """Reads through the data source and the fast path, a write: their plan strings
    (``explain`` in every mode, the query executions), and what the UI's REST API says of
    the application's SQL queries and environment."""
    kwargs = {"warehouse": lake["warehouse"], "storage_options": lake["storage"]}
    frames = [spark.read.format("arrowlake").options(**lake["options"]).load(table),
              arrowlake.spark.read(spark, lake["uri"], table, **kwargs)]
    texts = []
    for df in frames:
        df.collect()
        for mode in ("simple", "extended", "formatted", "cost", "codegen"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                df.explain(mode)
            texts.append(out.getvalue())
        texts.append(df._jdf.queryExecution().toString())
    frames[0].write.format("arrowlake").options(**lake["options"]).mode("append").save(table)
    sc = spark.sparkContext
    api = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    ui = {}
    for page in ("sql?details=true&planDescription=true", "environment", "jobs", "stages"):
        with opener.open(f"{api}/{page}", timeout=30) as resp:
            ui[page] = json.loads(resp.read())
    return {"plans": texts, "ui": json.dumps(ui)}

