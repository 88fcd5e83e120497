"""Spark benchmark: the arrowlake data source and fast path against Spark's own Parquet, one run.

10,000,000 rows (int64 id, int32 qty, float64 amount, string customer, string day), a local
Spark (``local[2]``). Prints medians of ``--runs`` runs, rows per second and the ratios the
PySpark issue sets targets for:

- a full aggregate (count, sum, max) of an append table: data source >= 0.5x and fast path
  >= 0.9x ``spark.read.parquet`` of the same rows. Two aggregates are timed, and they read
  differently:

  * ``count(*), sum(amount), max(qty)`` touches 2 of the 5 columns. Spark's Parquet reader
    prunes columns and decodes only those two; PySpark gives a Python source no column
    pruning, so ``format('arrowlake')`` (and any Python source) moves all 5 columns of every
    row into the JVM, where Spark copies each row into its row format. The
    ``option("columns", "qty,amount")`` row is what a user who prunes by hand gets.
  * ``... , sum(id), sum(length(customer)), sum(length(day))`` touches every column, so
    Spark's reader decodes everything a source without column pruning must move (the
    issue's reference numbers, 7.6 M rows/s for Spark's reader and 0.55x for a plain Python
    source, are of this kind). Cheap functions (sums of lengths, not max of strings) keep
    the aggregation itself from hiding the cost of reading.

  Each aggregate also times a minimal Python source (no lake, no planning) over the Parquet
  copy: the most any Python source reaches here.
- the same for a primary-key table after 5 upserts of 10% of its keys, against a Parquet copy
  of its live rows;
- the same for a primary-key table with deletion vectors (merge on write) after the same
  upserts: the fast path reads its files with Spark's Parquet reader and drops the deleted
  positions (target >= 0.8x the Parquet copy of its live rows); then a selective key range
  (1,001 ids) as Spark's own ``.where`` on the fast path against ``spark.read.parquet`` of
  the copy with the same ``.where``, printing what Spark pushed into the fast path's Parquet
  scan (PushedFilters), with arrowlake's ``filter`` on the fast path and on the data source
  for reference;
- a 1-in-10,000 key filter: >= 10x faster as ``option("filter", ...)`` (which prunes files)
  than as ``.where(...)`` (the source takes no pushed filter, see arrowlake.spark.source).
  For reference, Spark's own time for the query over the Parquet copy, and the minimal Python
  source running the same query over a Parquet file of just the 1,000 selected rows: the
  fixed cost of any Python source query here (two planning round trips to Python workers, a
  task in a Python worker, two stages for the count): the floor pruning can approach;
- writes: ``df.write.format("arrowlake")`` >= 0.5x ``df.write.parquet`` of the same DataFrame,
  a zstd table against Spark writing zstd (and, for reference, Spark's default snappy), a
  snappy table against snappy; the first write of each kind in the session is timed on its own
  (Python worker start-up, JVM code generation) so that steady-state rows do not depend on
  their order;
- worker start-up: a fresh Python process doing what an executor's Python worker does to
  read a split (PySpark's daemon has imported ``pyspark.worker`` before it forks one; the
  worker unpickles the read function planned on the driver, with arrowlake's reader, and the
  partition, and reads it), timed to its first batch, against ``python -c "import
  pyarrow.parquet"``. Target: arrowlake's part (unpickling, which imports arrowlake, and the
  first batch) <= 0.3 s;
- on S3 (the moto server of tests/services.py, at most ``--s3-rows`` rows, default 2,000,000:
  moto keeps objects in memory): the fast path, reading through S3A (hadoop-aws from
  ``spark.jars.packages``), against ``spark.read.parquet`` of the same files with the same
  S3A settings (target >= 0.9x);
- the fast path through Spark Connect (a Connect server started from the wheel with the
  classic session's settings, its client in a process of its own) against the classic
  session's fast path, on the append table and, with ``dv``, the deletion-vector table
  (target >= 0.9x).

    python bench/spark.py [--rows 10000000] [--runs 3] [--only reads,pushdown]

``--only`` runs some sections: ``writes``, ``reads`` (append table), ``pushdown``, ``pk``
(primary-key table), ``dv`` (primary-key table with deletion vectors), ``startup`` (worker
start-up), ``s3``, ``connect``. The read sections need data: without ``writes``, the append
table and its Parquet copy are written once, untimed.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.services: the S3 server
os.environ["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable

import arrowlake as al  # noqa: E402
import arrowlake.spark as als  # noqa: E402
from arrowlake.spark.fast import read_files  # noqa: E402
from arrowlake.spark.s3a import s3a_package  # noqa: E402


def median_time(fn: Callable[[], object], runs: int, warmup: int = 0) -> float:
    """The median of ``runs`` timed calls, after ``warmup`` untimed ones (reads take one each:
    the JVM compiles the code of a new query shape in the first runs, and without a warm-up
    only the contender measured first after the writes is timed cold)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plain_source():
    """The reference for any Python data source: a minimal one (no lake, no planning) yielding
    the Parquet copy's record batches as pyarrow reads them, one partition per file. PySpark
    moves every column of every row of a Python source from the Python worker into the JVM
    (the API has no column pruning), which bounds what the arrowlake source can reach."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class PlainReader(DataSourceReader):
        def __init__(self, path, schema):
            self.path, self.schema = path, schema

        def partitions(self):
            import glob

            return [InputPartition(f) for f in sorted(glob.glob(f"{self.path}/*.parquet"))]

        def read(self, partition):
            import pyarrow as pa
            import pyarrow.parquet as pq
            from pyspark.sql.pandas.types import to_arrow_schema

            target = to_arrow_schema(self.schema, timezone="UTC")
            for batch in pq.ParquetFile(partition.value).iter_batches(
                    batch_size=131_072, columns=self.schema.fieldNames()):
                yield pa.RecordBatch.from_arrays(batch.columns, schema=target)

    class PlainSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_plain_parquet"

        def schema(self):
            return "id long, qty int, amount double, customer string, day string"

        def reader(self, schema):
            return PlainReader(self.options["path"], schema)

    return PlainSource


def generated(spark, rows: int):
    from pyspark.sql import functions as F

    return spark.range(0, rows, 1, 2).select(
        F.col("id"),
        (F.col("id") % 1000).cast("int").alias("qty"),
        (F.col("id") * 7 % 10007 / 3.0).alias("amount"),
        F.concat(F.lit("customer-"), (F.col("id") * 31 % 100000).cast("string"))
        .alias("customer"),
        F.concat(F.lit("2026-11-"), F.lpad((F.col("id") % 28 + 1).cast("string"), 2, "0"))
        .alias("day"))


def aggregate(df) -> tuple:
    from pyspark.sql import functions as F

    return tuple(df.agg(F.count("*"), F.sum("amount"), F.max("qty")).collect()[0])


def aggregate_all(df) -> tuple:
    """An aggregate that reads every column (cheaply: sums of string lengths)."""
    from pyspark.sql import functions as F

    return tuple(df.agg(F.count("*"), F.sum("amount"), F.max("qty"), F.sum("id"),
                        F.sum(F.length("customer")), F.sum(F.length("day"))).collect()[0])


def same(a: tuple, b: tuple) -> bool:
    """Equal aggregates (float sums may differ in the last bits with the reading order)."""
    return (len(a) == len(b) and a[0] == b[0] and a[2:] == b[2:]
            and math.isclose(a[1], b[1], rel_tol=1e-9))


def mib(where) -> str:
    """The size of a Parquet directory, or of a table's current files, in MiB."""
    if isinstance(where, Path):
        size = sum(f.stat().st_size for f in where.rglob("*.parquet"))
    else:
        size = pc.sum(where.files()["file_size"]).as_py() or 0
    return f"{size / 2**20:.1f} MiB"

#: What an executor's Python worker runs to read a split, after PySpark's daemon forked it
#: (the daemon has imported pyspark.worker): prints arrowlake's part of the time, unpickling
#: the planned read function (which imports arrowlake) and the partition to the first batch.
WORKER = """
import sys, time
import pyspark.worker
from pyspark.worker_util import pickleSer
import pyarrow as pa
start = time.perf_counter()
with open(sys.argv[1] + ".command", "rb") as f:
    read, _ = pickleSer.loads(f.read())
with pa.ipc.open_stream(sys.argv[1] + ".partition") as stream:
    next(read(iter(list(stream))))
print(time.perf_counter() - start)
"""


def plan_worker_read(lake_path: str, table: str, prefix: Path) -> None:
    """Plan a read of ``table`` as PySpark's planning worker does; the pickled read function
    and the first partition (as the JVM sends it: an Arrow stream) go to files at ``prefix``."""
    import io

    from pyspark.serializers import read_int
    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark.sql.worker.plan_data_source_read import write_read_func_and_partitions

    from arrowlake.spark.stream import ArrowlakeDataSource

    source = ArrowlakeDataSource(CaseInsensitiveDict({"lake": lake_path, "path": table}))
    schema = source.schema()
    out = io.BytesIO()
    write_read_func_and_partitions(out, reader=source.reader(schema), data_source=source,
                                   schema=schema, max_arrow_batch_size=10_000,
                                   binary_as_bytes=True)
    planned = io.BytesIO(out.getvalue())
    Path(f"{prefix}.command").write_bytes(planned.read(read_int(planned)))
    read_int(planned)  # the number of partitions
    batch = pa.record_batch({"partition": pa.array([planned.read(read_int(planned))],
                                                   pa.binary())})
    with pa.ipc.new_stream(f"{prefix}.partition", batch.schema) as writer:
        writer.write_batch(batch)


def fresh_process(args: list[str]) -> tuple[float, str]:
    """Wall time of a fresh Python process running ``args``, and what it printed."""
    import subprocess

    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


SECTIONS = ("writes", "reads", "pushdown", "pk", "dv", "startup", "s3", "connect")

#: The classic session's settings, which the Connect server runs with too.
SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g"}


def start_connect_server(log: Path) -> tuple[subprocess.Popen, str]:
    """A Spark Connect server from the PySpark wheel (``local[2]``, :data:`SPARK_CONF`) on a
    free loopback port, and its URL once it listens."""
    import pyspark

    home = Path(pyspark.__file__).parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = {**SPARK_CONF, "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port)}
    command = [str(home / "bin" / "spark-submit"), "--class",
               "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True,
                                  env={**os.environ, "SPARK_HOME": str(home)})
    deadline = time.monotonic() + 180
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Connect server did not start: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"sc://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)


def warm_up(spark, lake_path: str, tables: list[str], parquet: str, rounds: int = 3) -> None:
    """The queries a comparison times, run untimed first: a JVM that has just started runs its
    first queries several times slower (code generation, JIT), and the Connect server starts
    fresh while the classic session has run other sections."""
    for _ in range(rounds):
        aggregate(spark.read.parquet(parquet))
        for table in tables:
            aggregate(als.read(spark, lake_path, table))


def connect_fast_path(url: str, lake_path: str, tables: list[str], runs: int, parquet: str
                      ) -> tuple[list[tuple[float, tuple, str]], float]:
    """In a process of its own (PySpark's functions build Connect columns only in a process
    whose session is a Connect one): per table, the median time of the fast path's aggregate
    through Spark Connect, the aggregate and the plan; and the time of the same aggregate by
    ``spark.read.parquet`` of ``parquet`` through Connect (what Connect itself costs)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    warm_up(spark, lake_path, tables, parquet)
    out = []
    for table in tables:
        result = aggregate(als.read(spark, lake_path, table))
        seconds = median_time(lambda t=table: aggregate(als.read(spark, lake_path, t)), runs, 1)
        out.append((seconds, result, als.plan_read(spark, lake_path, table).describe()))
    plain = median_time(lambda: aggregate(spark.read.parquet(parquet)), runs, 1)
    spark.stop()
    return out, plain

SCHEMA = pa.schema([("id", pa.int64()), ("qty", pa.int32()), ("amount", pa.float64()),
                    ("customer", pa.string()), ("day", pa.string())])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--s3-rows", type=int, default=2_000_000)
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run, of {','.join(SECTIONS)}")
    args = parser.parse_args()
    n, runs = args.rows, args.runs
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if not only <= set(SECTIONS):
        parser.error(f"--only takes {','.join(SECTIONS)}, not {','.join(only - set(SECTIONS))}")

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("arrowlake-bench")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    if "s3" in only:  # S3A for Spark's own reader
        builder = builder.config("spark.jars.packages", s3a_package())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="arrowlake-spark-bench-"))
    lake_path = str(root / "lake")
    lake = al.connect(lake_path)
    rows_out: list[tuple[str, float, float, str]] = []

    def report(name: str, seconds: float, rows: int, note: str = "") -> None:
        rows_out.append((name, seconds, rows / seconds / 1e6, note))
        print(f"  {name:<58} {seconds:7.2f} s {rows / seconds / 1e6:7.2f} M rows/s {note}",
              flush=True)

    def source(name: str):
        return spark.read.format("arrowlake").option("lake", lake_path).load(name)

    def source_columns(name: str):
        # PySpark gives Python sources no column pruning: the columns option is the way.
        return spark.read.format("arrowlake").option("lake", lake_path) \
            .option("columns", "qty,amount").load(name)

    try:
        print(f"{n:,} rows, {runs} runs each, medians", flush=True)
        # -- writes --------------------------------------------------------------------------
        # Each format first writes a small DataFrame once, reported on its own line: the first
        # Python data source write of a session starts PySpark's Python workers (and imports
        # arrowlake in each), the first Parquet write compiles the JVM code. Without this, the
        # first timed row of each kind carried the start-up and the row order decided the ratios.
        # A zstd table is compared with Spark writing zstd too (Spark's default is snappy).
        lake.create_table("bench.orders", SCHEMA)

        def parquet_write(compression: str, rows: int = n, name: str = "copy") -> None:
            generated(spark, rows).write.mode("overwrite").option("compression", compression) \
                .parquet(str(root / name))

        def lake_write(table: str, rows: int = n) -> None:
            generated(spark, rows).write.format("arrowlake").option("lake", lake_path) \
                .mode("overwrite").save(table)

        if "writes" in only:
            print("writes", flush=True)
            lake.create_table("bench.warmup", SCHEMA)
            lake.create_table("bench.snappy", SCHEMA,
                              properties={"write.compression": "snappy"})
            report("start-up: first df.write.parquet of the session, 1,000 rows",
                   median_time(lambda: parquet_write("snappy", 1000, "warmup"), 1), 1000)
            report("start-up: first df.write.format('arrowlake') of the session, 1,000 rows",
                   median_time(lambda: lake_write("bench.warmup", 1000), 1), 1000)
            pw = median_time(lambda: parquet_write("snappy"), runs)
            report("df.write.parquet (Spark's default snappy)", pw, n, f"{mib(root / 'copy')}")
            pz = median_time(lambda: parquet_write("zstd", name="copy_zstd"), runs)
            report("df.write.parquet, option compression zstd", pz, n,
                   f"{mib(root / 'copy_zstd')}")
            lw = median_time(lambda: lake_write("bench.orders"), runs)
            report("df.write.format('arrowlake'), default zstd", lw, n,
                   f"{mib(lake.table('bench.orders'))}; ratio {pz / lw:.2f} to Spark zstd, "
                   f"{pw / lw:.2f} to Spark snappy (target >= 0.5)")
            assert lake.table("bench.orders").count() == n
            sw = median_time(lambda: lake_write("bench.snappy"), runs)
            report("df.write.format('arrowlake'), table compression snappy", sw, n,
                   f"{mib(lake.table('bench.snappy'))}; ratio {pw / sw:.2f} to Spark snappy "
                   "(target >= 0.5)")
        elif only & {"reads", "pushdown", "connect"}:
            parquet_write("snappy")  # the data the read sections read, untimed
            lake_write("bench.orders")
        if only & {"reads", "pushdown", "connect"}:
            assert lake.table("bench.orders").count() == n

        def compare(agg: Callable[[object], tuple], parquet: Path, label: str, table: str,
                    *, plain: bool, columns: bool, fast_target: float = 0.9) -> None:
            """``agg`` by Spark's Parquet reader over ``parquet`` against the arrowlake
            contenders over ``table`` (and the minimal Python source over ``parquet`` when
            ``plain``), each checked to give the same aggregate before it is timed."""
            expected = agg(spark.read.parquet(str(parquet)))
            base = median_time(lambda: agg(spark.read.parquet(str(parquet))), runs, 1)
            report(label, base, n)
            plan = als.plan_read(spark, lake, table)
            contenders: list[tuple[str, Callable[[], tuple], str]] = []
            if plain:
                contenders.append((
                    "reference: a minimal Python source over the Parquet copy",
                    lambda: agg(spark.read.format("bench_plain_parquet").load(str(parquet))),
                    "(what any Python source reaches here)"))
            contenders.append(("format('arrowlake')", lambda: agg(source(table)),
                               "(target >= 0.5)"))
            if columns:
                contenders.append(("format('arrowlake'), option columns='qty,amount'",
                                   lambda: agg(source_columns(table)), "(target >= 0.5)"))
            contenders.append(("arrowlake.spark.read (fast path)",
                               lambda: agg(als.read(spark, lake, table)),
                               f"(target >= {fast_target}); {plan.describe()}"))
            for name, run, note in contenders:
                assert same(run(), expected), name
                seconds = median_time(run, runs, 1)
                report(name, seconds, n, f"ratio {base / seconds:.2f} {note}")

        # -- full aggregate, append table ----------------------------------------------------
        if "reads" in only:
            spark.dataSource.register(plain_source())
            print("full aggregate, append table", flush=True)
            compare(aggregate, root / "copy", "spark.read.parquet", "bench.orders",
                    plain=True, columns=True)
            print("full aggregate reading every column, append table", flush=True)
            compare(aggregate_all, root / "copy", "spark.read.parquet", "bench.orders",
                    plain=True, columns=False)

        # -- selective key filter ------------------------------------------------------------
        if "pushdown" in only:
            print("key filter selecting 1 in 10,000 rows", flush=True)
            lo = n // 2
            query = f"id >= {lo} and id < {lo + n // 10_000}"
            floor = median_time(
                lambda: spark.read.parquet(str(root / "copy")).where(query).count(), runs, 1)
            report("reference: spark.read.parquet(...).where(...)", floor, n,
                   "(Spark's own time for the query)")
            if "reads" not in only:
                spark.dataSource.register(plain_source())
            selected = root / "selected"
            spark.read.parquet(str(root / "copy")).where(query).coalesce(1).write \
                .mode("overwrite").parquet(str(selected))
            py_floor = median_time(
                lambda: spark.read.format("bench_plain_parquet").load(str(selected))
                .where(query).count(), runs, 1)
            report("reference: minimal Python source, only the selected rows", py_floor, n,
                   "(the fixed cost of a Python source query)")
            off = median_time(lambda: source("bench.orders").where(query).count(), runs, 1)
            report("format('arrowlake').where(...)", off, n)

            def pruned() -> int:
                return spark.read.format("arrowlake").option("lake", lake_path) \
                    .option("filter", query).load("bench.orders").count()

            assert pruned() == n // 10_000
            on = median_time(pruned, runs, 1)
            report("format('arrowlake').option('filter', ...)", on, n,
                   f"{off / on:.1f}x faster (target >= 10x; "
                   f"{off / floor:.1f}x at Spark's own time, "
                   f"{off / py_floor:.1f}x at the Python source floor)")

        # -- primary-key tables after 5 upserts of 10% of the keys ------------------------------
        def upserted(name: str, *, deletion_vectors: bool) -> Path:
            """A primary-key table of ``n`` rows after 5 upserts of 10% of its keys (random
            keys), and a Parquet copy of its live rows (returned)."""
            table = lake.create_table(name, SCHEMA, primary_key=["id"], buckets=8,
                                      deletion_vectors=deletion_vectors)
            generated(spark, n).write.format("arrowlake").option("lake", lake_path) \
                .mode("append").save(name)
            rng = np.random.default_rng(7)
            for i in range(5):
                ids = np.sort(rng.choice(n, n // 10, replace=False)).astype(np.int64)
                table.upsert(pa.table({
                    "id": ids, "qty": pa.array((ids % 1000 + i).astype(np.int32)),
                    "amount": pa.array(ids * 0.5 + i), "customer": pa.array(
                        np.char.add("updated-", (ids % 1000).astype(str)).astype(object)),
                    "day": pa.array(["2026-12-01"] * len(ids))}, schema=SCHEMA))
            copy = root / f"{name}.parquet"
            pq.write_table(table.to_arrow(), str(copy))
            return copy

        if "pk" in only:
            print("full aggregate, primary-key table after 5 upserts of 10% of the keys",
                  flush=True)
            live = upserted("bench.users", deletion_vectors=False)  # merge on read
            compare(aggregate, live, "spark.read.parquet (copy of live rows)",
                    "bench.users", plain=False, columns=True)

        if "dv" in only:
            print("full aggregate, primary-key table with deletion vectors after 5 upserts of "
                  "10% of the keys", flush=True)
            live = upserted("bench.users_dv", deletion_vectors=True)
            compare(aggregate, live, "spark.read.parquet (copy of live rows)",
                    "bench.users_dv", plain=False, columns=False, fast_target=0.8)
            # The table's own files (zstd, its encodings, one file per bucket and write) read
            # with nothing dropped: what the fast path would take without deletion vectors.
            files = [p for g in als.plan_read(spark, lake, "bench.users_dv").parquet
                     for p in g.paths]
            # Listed on the driver as the fast path lists them (past 32 paths Spark's own
            # listing job would cost more than the read).
            report("reference: spark.read.parquet of the table's files, deleted rows kept",
                   median_time(lambda: aggregate(read_files(spark, spark.read, files)),
                               runs, 1), n, "(the fast path's ceiling)")
            print("full aggregate reading every column, same table", flush=True)
            compare(aggregate_all, live, "spark.read.parquet (copy of live rows)",
                    "bench.users_dv", plain=False, columns=False, fast_target=0.8)
            where_on_fast_path(spark, lake, lake_path, "bench.users_dv", live, n, runs, report)

        # -- worker start-up -------------------------------------------------------------------
        if "startup" in only:
            print("worker start-up: a fresh Python process to the first batch of a split",
                  flush=True)
            startup = lake.create_table("bench.startup", SCHEMA)
            startup.append(generated(spark, 100_000).toArrow().cast(SCHEMA))
            prefix = root / "startup"
            plan_worker_read(lake_path, "bench.startup", prefix)
            times = max(runs, 5)
            baseline = statistics.median(
                fresh_process(["-c", "import pyarrow.parquet"])[0] for _ in range(times))
            walls, parts = [], []
            for _ in range(times):
                wall, out = fresh_process(["-c", WORKER, str(prefix)])
                walls.append(wall)
                parts.append(float(out))
            wall, part = statistics.median(walls), statistics.median(parts)
            for label, seconds, note in (
                    ("reference: python -c 'import pyarrow.parquet'", baseline, ""),
                    ("worker: fresh process to the first batch of a split", wall,
                     f"({wall - baseline:+.2f} s over the reference)"),
                    ("  of which arrowlake: unpickle the read, first batch", part,
                     "(target <= 0.3)")):
                print(f"  {label:<58} {seconds:7.2f} s {note}", flush=True)

        if "s3" in only:
            s3_aggregate(spark, root, min(n, args.s3_rows), runs, report)

        # -- the fast path through Spark Connect ----------------------------------------------
        if "connect" in only:
            print("fast path, Spark Connect client against the classic session", flush=True)
            tables = ["bench.orders"] + (["bench.users_dv"] if "dv" in only else [])
            server, url = start_connect_server(root / "connect-server.log")
            try:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) \
                        as client:
                    remote, plain = client.submit(connect_fast_path, url, lake_path, tables,
                                                  runs, str(root / "copy")).result()
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait()
            warm_up(spark, lake_path, tables, str(root / "copy"))
            classic_plain = median_time(lambda: aggregate(spark.read.parquet(str(root / "copy"))),
                                        runs, 1)
            report("reference: spark.read.parquet (copy), classic session", classic_plain, n)
            report("reference: spark.read.parquet (copy) through Spark Connect", plain, n,
                   f"ratio {classic_plain / plain:.2f} (Connect's own cost, no target)")
            for table, (seconds, result, described) in zip(tables, remote, strict=True):
                expected = aggregate(als.read(spark, lake_path, table))
                assert same(result, expected), table
                classic = median_time(lambda t=table: aggregate(als.read(spark, lake_path, t)),
                                      runs, 1)
                report(f"{table}: arrowlake.spark.read, classic session", classic, n)
                report(f"{table}: arrowlake.spark.read through Spark Connect", seconds, n,
                       f"ratio {classic / seconds:.2f} (target >= 0.9); {described}")

    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


#: What Spark pushed into a Parquet scan, as its plan prints it.
_PUSHED = re.compile(r"PushedFilters: \[([^\]]*)\]")


def pushed_filters(df) -> list[str]:
    """The PushedFilters of every Parquet scan in ``df``'s physical plan (classic session)."""
    return _PUSHED.findall(df._jdf.queryExecution().executedPlan().toString())


def where_on_fast_path(spark, lake, lake_path: str, table: str, parquet: Path, n: int,
                       runs: int, report: Callable[..., None]) -> None:
    """A selective key range on the deletion-vector table: Spark's own ``.where`` on the fast
    path (which Spark pushes into the Parquet scan of the table's files, see
    ``pushed_filters``) against ``spark.read.parquet`` of the live rows' copy with the same
    ``.where``, and, for reference, the same range as arrowlake's ``filter`` (which also
    prunes files by their statistics) through the fast path and through the data source."""
    lo = n // 2
    query = f"id between {lo} and {lo + 1000}"
    print(f"selective key range ({query}), same table", flush=True)
    expected = spark.read.parquet(str(parquet)).where(query).count()
    base = median_time(lambda: spark.read.parquet(str(parquet)).where(query).count(), runs, 1)
    report("spark.read.parquet (copy of live rows).where(...)", base, n,
           f"({expected:,} rows)")
    fast = als.read(spark, lake, table).where(query)
    contenders = [
        ("arrowlake.spark.read(...).where(...)",
         lambda: als.read(spark, lake, table).where(query).count(),
         f"PushedFilters {pushed_filters(fast)}"),
        ("arrowlake.spark.read(..., filter=...)",
         lambda: als.read(spark, lake, table, filter=query).count(),
         als.plan_read(spark, lake, table, filter=query).describe()),
        ("format('arrowlake').option('filter', ...)",
         lambda: spark.read.format("arrowlake").option("lake", lake_path)
         .option("filter", query).load(table).count(), ""),
    ]
    for name, run, note in contenders:
        assert run() == expected, name
        seconds = median_time(run, runs, 1)
        report(name, seconds, n, f"ratio {base / seconds:.2f} {note}")


def s3_aggregate(spark, root: Path, n: int, runs: int,
                 report: Callable[[str, float, int, str], None]) -> None:
    """The fast path on S3 (moto) against ``spark.read.parquet`` of the same files."""
    from tests.services import start_s3

    print(f"full aggregate, append table on S3 (moto), {n:,} rows", flush=True)
    server = start_s3(threads=16)
    try:
        warehouse = f"s3://{server.create_bucket('bench-spark')}/warehouse"
        options = server.storage_options()
        uri = f"sqlite:///{root}/s3-meta.db"
        lake = al.connect(uri, warehouse=warehouse, storage_options=options)
        lake.create_table("bench.orders_s3", SCHEMA)
        generated(spark, n).write.format("arrowlake").option("lake", uri) \
            .option("warehouse", warehouse).option("storageOptions", json.dumps(options)) \
            .mode("append").save("bench.orders_s3")
        plan = als.plan_read(spark, lake, "bench.orders_s3")
        assert plan.parquet and not plan.source, plan.describe()  # S3A reaches every file
        files = [p for g in plan.parquet for p in g.paths]
        settings = dict(plan.parquet[0].options)

        def parquet() -> tuple:
            return aggregate(spark.read.options(**settings).parquet(*files))

        def fast() -> tuple:
            return aggregate(als.read(spark, lake, "bench.orders_s3"))

        assert same(fast(), parquet())
        base = median_time(parquet, runs, 1)
        report("spark.read.parquet of the table's files on S3 (S3A)", base, n, "")
        seconds = median_time(fast, runs, 1)
        report("arrowlake.spark.read (fast path) on S3", seconds, n,
               f"ratio {base / seconds:.2f} (target >= 0.9); {plan.describe()}")
        lake.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
