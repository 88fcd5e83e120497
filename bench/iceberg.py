"""Spark reading our deletion-vector table through the Iceberg REST catalog, in one run.

A primary-key table with deletion vectors: ``--rows`` rows (default 2,000,000: id int64, k a
12-char string, v float64 with 1% NaN and 2% null, ts timestamp, d date, amt decimal(18,4)),
then ``--upserts`` upserts of ``--upsert-rows`` rows (default 5 of 200,000: half existing keys,
half new) and a delete of 500 keys. Then, in one Spark 4.1 session with Iceberg's runtime
(``iceberg-spark-runtime-4.1_2.13:1.12.0``, in the ``spark41`` test environment):

- **ours**: ``lake.bench.users`` through ``arrowlake iceberg-rest`` (started here, in-process);
- **spark-iceberg**: an Iceberg v3 table Spark itself wrote with the same rows and the same
  history (an INSERT, then a MERGE INTO per upsert and a DELETE, merge-on-read so that it
  keeps deletion vectors too) in a Hadoop catalog in a temp warehouse;
- **parquet**: ``spark.read.parquet`` over one pyarrow-written copy of the live rows.

Two aggregates, ``count(*), sum(nanvl(v, 0))`` (two columns) and one over every column, each
run ``--runs`` times interleaved after a warm-up; every contender must give the same answers.
Also: the time to publish each snapshot's Iceberg metadata (incrementally, as the catalog
does on a load), and the REST load latency (a full load, and a 304 with ``If-None-Match``).
Where ours is slower than Spark's own table, the files, row groups, encodings and deletion
vectors of both are printed side by side.

    python bench/iceberg.py [--rows 2000000] [--upserts 5] [--upsert-rows 200000] [--runs 5]
                            [--spark-python PATH] [--driver-memory 6g]

Target (issue 32): ours >= 0.95x the Spark-written Iceberg table. Ratios are speeds (time of
the baseline over time of the contender: above 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
TOKEN = "bench-token"

NARROW = ["count(*) AS n", "sum(nanvl(v, 0D)) AS v"]
WIDE = ["count(*) AS n", "sum(id) AS id", "sum(length(k)) AS k", "sum(nanvl(v, 0D)) AS v",
        "max(ts) AS ts", "min(d) AS d", "sum(amt) AS amt"]


# -- the lake (main environment) -----------------------------------------------------------------


def _batch(ids: Any, seed: int) -> Any:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    n = len(ids)
    v = rng.normal(size=n)
    v[rng.random(n) < 0.01] = np.nan
    v_mask = rng.random(n) < 0.02
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype="S1")
    k = rng.choice(letters, size=(n, 12)).view("S12").ravel().astype(str)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "k": pa.array(k),
        "v": pa.array(v, mask=v_mask),
        "ts": pa.array((1_790_000_000_000_000 + ids * 1_000_003).astype("datetime64[us]")),
        "d": pa.array((20_000 + ids % 400).astype("datetime64[D]"), pa.date32()),
        "amt": pa.array(ids % 100_000, pa.int32()).cast(pa.decimal128(18, 4)),
    })


def build(work: Path, rows: int, upserts: int, upsert_rows: int, compact: bool = False
          ) -> dict[str, Any]:
    """The lake, the Parquet inputs Spark replays, the live-rows copy, publish times. With
    ``compact``, arrowlake's table is fully compacted (and published) after its history,
    while Spark's keeps its MERGE history as it is."""
    import numpy as np
    import pyarrow.parquet as pq

    import arrowlake as al
    from arrowlake.iceberg import publish

    lake = al.connect(work / "lake")
    lake.create_namespace("bench")
    first = _batch(np.arange(rows), 0)
    table = lake.create_table("bench.users", first.schema, primary_key=["id"],
                              deletion_vectors=True)
    inputs = work / "inputs"
    inputs.mkdir()
    steps: list[dict[str, Any]] = []
    publish_s: list[float] = []

    def commit(kind: str, **extra: Any) -> None:
        started = time.perf_counter()
        publish(table)
        publish_s.append(time.perf_counter() - started)
        steps.append({"kind": kind, "snapshot": table.current_snapshot_id, **extra})

    started = time.perf_counter()
    table.upsert(first)
    pq.write_table(first, inputs / "0.parquet")
    commit("insert", path=str(inputs / "0.parquet"))
    rng = np.random.default_rng(1)
    next_id = rows
    for i in range(upserts):
        half = upsert_rows // 2
        old = rng.choice(next_id, size=half, replace=False)
        new = np.arange(next_id, next_id + upsert_rows - half)
        next_id += len(new)
        batch = _batch(np.concatenate([old, new]), 10 + i)
        table.upsert(batch)
        path = inputs / f"{i + 1}.parquet"
        pq.write_table(batch, path)
        commit("merge", path=str(path))
    low = min(1000, max(rows // 2, 0))
    table.delete(f"id >= {low} and id < {low + 500}")
    commit("delete", where=f"id >= {low} AND id < {low + 500}")
    write_s = time.perf_counter() - started
    if compact:
        table.compact(full=True)
        publish(table)
    live = table.to_arrow()
    copy = work / "copy.parquet"
    pq.write_table(live, copy, compression="snappy")
    files = table.files()
    lake.close()
    return {"steps": steps, "publish_s": publish_s, "write_s": write_s,
            "live_rows": live.num_rows, "copy": str(copy), "copy_bytes": copy.stat().st_size,
            "files": files.num_rows}


def rest_latency(lake_dir: Path, loads: int) -> dict[str, Any]:
    import requests

    import arrowlake as al
    from arrowlake.iceberg_rest import RunningCatalog

    lake = al.connect(lake_dir)
    out: dict[str, Any] = {}
    with RunningCatalog(lake, port=0, tokens=[TOKEN], shutdown_timeout=5) as running, \
            requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        url = running.url + "/v1/namespaces/bench/tables/users"
        first = session.get(url, timeout=60)
        etag = first.headers["etag"]
        out["body_bytes"] = len(first.content)
        for name, headers in (("full", {}), ("not_modified", {"If-None-Match": etag})):
            times = []
            for _ in range(loads):
                started = time.perf_counter()
                answer = session.get(url, headers=headers, timeout=60)
                times.append(time.perf_counter() - started)
                assert answer.status_code == (200 if name == "full" else 304)
            times.sort()
            out[name] = {"median_ms": 1000 * statistics.median(times),
                         "p95_ms": 1000 * times[int(0.95 * (len(times) - 1))]}
    lake.close()
    return out


def files_report(paths: list[str]) -> dict[str, Any]:
    """Sizes, row groups, codecs and encodings of the Parquet files a reader opens."""
    import pyarrow.parquet as pq

    groups, total, rows = 0, 0, 0
    encodings: set[str] = set()
    codecs: set[str] = set()
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        groups += meta.num_row_groups
        rows += meta.num_rows
        total += os.path.getsize(path)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                codecs.add(column.compression)
                if column.path_in_schema in ("v", "k"):
                    encodings.add(f"{column.path_in_schema}:{'/'.join(column.encodings)}")
    return {"files": len(paths), "bytes": total, "rows": rows, "row_groups": groups,
            "codecs": sorted(codecs), "encodings": sorted(encodings)}


# -- Spark (the spark41 environment, without arrowlake) ------------------------------------------


def spark_part(plan_path: str) -> None:
    from pyspark.sql import SparkSession

    plan = json.loads(Path(plan_path).read_text())
    spark = (SparkSession.builder.master("local[2]").appName("bench-iceberg")
             .config("spark.jars.packages", RUNTIME)
             .config("spark.driver.memory", plan["driver_memory"])
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.extensions",
                     "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
             .config("spark.sql.catalog.lake.type", "rest")
             .config("spark.sql.catalog.lake.uri", plan["uri"])
             .config("spark.sql.catalog.lake.token", TOKEN)
             .config("spark.sql.catalog.hadoop", "org.apache.iceberg.spark.SparkCatalog")
             .config("spark.sql.catalog.hadoop.type", "hadoop")
             .config("spark.sql.catalog.hadoop.warehouse", plan["warehouse"])
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {"spark": spark.version}
    # Spark's own Iceberg table, with the same rows and history.
    started = time.perf_counter()
    spark.sql("CREATE TABLE hadoop.bench.users (id BIGINT NOT NULL, k STRING, v DOUBLE, "
              "ts TIMESTAMP_NTZ, d DATE, amt DECIMAL(18,4)) USING iceberg TBLPROPERTIES ("
              "'format-version'='3', 'write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    for step in plan["steps"]:
        if step["kind"] == "insert":
            spark.read.parquet(step["path"]).writeTo("hadoop.bench.users").append()
        elif step["kind"] == "merge":
            spark.read.parquet(step["path"]).createOrReplaceTempView("source")
            spark.sql("MERGE INTO hadoop.bench.users t USING source s ON t.id = s.id "
                      "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
        else:
            spark.sql(f"DELETE FROM hadoop.bench.users WHERE {step['where']}")
    result["spark_write_s"] = time.perf_counter() - started
    files = spark.sql("SELECT file_path, content FROM hadoop.bench.users.files").collect()
    result["spark_data_files"] = [r.file_path.replace("file:", "") for r in files
                                  if r.content == 0]
    result["spark_delete_files"] = sum(1 for r in files if r.content != 0)

    contenders = {
        "ours": lambda: spark.table("lake.bench.users"),
        "spark-iceberg": lambda: spark.table("hadoop.bench.users"),
        "parquet": lambda: spark.read.parquet(plan["copy"]),
    }
    times: dict[str, list[float]] = {}
    answers: dict[str, list[Any]] = {}
    for aggregate_name, aggregate in (("narrow", NARROW), ("wide", WIDE)):
        for name, frame in contenders.items():  # warm-up, and the answers compared
            answers[f"{name}/{aggregate_name}"] = [
                str(v) for v in frame().selectExpr(*aggregate).collect()[0]]
        for _ in range(plan["runs"]):
            for name, frame in contenders.items():
                started = time.perf_counter()
                frame().selectExpr(*aggregate).collect()
                times.setdefault(f"{name}/{aggregate_name}", []).append(
                    time.perf_counter() - started)
    result["times"] = times
    result["answers"] = answers
    spark.stop()
    Path(plan["out"]).write_text(json.dumps(result))


# -- the report ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--upserts", type=int, default=5)
    parser.add_argument("--upsert-rows", type=int, default=200_000)
    parser.add_argument("--compact", action="store_true",
                        help="compact arrowlake's table fully before the reads (Spark's "
                             "table keeps its history): what the files' layout costs")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--loads", type=int, default=200, help="REST loads timed per kind")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--spark-python", help="a Python with PySpark 4.1 (default: the "
                        "spark41 test environment, built on first use)")
    parser.add_argument("--spark-part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.spark_part:
        spark_part(args.spark_part)
        return

    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))
    import arrowlake as al
    from arrowlake.iceberg_rest import RunningCatalog

    spark_python = args.spark_python
    if spark_python is None:
        from tests.client_envs import client_python
        spark_python = str(client_python("spark41"))

    with tempfile.TemporaryDirectory(prefix="bench-iceberg-") as tmp:
        work = Path(tmp)
        print(f"building: {args.rows:,} rows, {args.upserts} upserts of {args.upsert_rows:,}, "
              "a delete of 500 ...", flush=True)
        built = build(work, args.rows, args.upserts, args.upsert_rows, args.compact)
        latency = rest_latency(work / "lake", args.loads)
        lake = al.connect(work / "lake")
        ours_paths = lake.table("bench.users").files().column("path").to_pylist()
        with RunningCatalog(lake, port=0, tokens=[TOKEN], shutdown_timeout=5) as running:
            plan = {"uri": running.url, "warehouse": str(work / "warehouse"),
                    "copy": built["copy"], "steps": built["steps"], "runs": args.runs,
                    "driver_memory": args.driver_memory, "out": str(work / "spark.json")}
            (work / "plan.json").write_text(json.dumps(plan))
            print("spark: writing its own table, then reading ...", flush=True)
            subprocess.run([spark_python, __file__, "--spark-part", str(work / "plan.json")],
                           check=True, env={k: v for k, v in os.environ.items()
                                            if k != "PYTHONPATH"})
        lake.close()
        spark = json.loads((work / "spark.json").read_text())
        ours_files = files_report([p.replace("file:", "") for p in ours_paths])
        theirs_files = files_report(spark["spark_data_files"])

    report(args, built, latency, spark, ours_files, theirs_files)


def _same(a: list[str], b: list[str]) -> bool:
    """The same answers; float sums may differ in their last digits (summation order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if abs(fx - fy) > 1e-9 * max(abs(fx), abs(fy), 1.0):
            return False
    return True


def report(args: argparse.Namespace, built: dict[str, Any], latency: dict[str, Any],
           spark: dict[str, Any], ours_files: dict[str, Any],
           theirs_files: dict[str, Any]) -> None:
    answers = spark["answers"]
    for aggregate in ("narrow", "wide"):
        found = {n: answers[f"{n}/{aggregate}"] for n in ("ours", "spark-iceberg", "parquet")}
        if not (_same(found["ours"], found["parquet"])
                and _same(found["spark-iceberg"], found["parquet"])):
            raise SystemExit(f"the {aggregate} aggregate differs between readers: {found}")
    print(f"\nSpark {spark['spark']}, local[2]; {built['live_rows']:,} live rows; medians of "
          f"{args.runs} interleaved runs after a warm-up (answers identical across readers)\n")
    header = (f"{'aggregate':<9} {'reader':<14} {'min s':>7} {'median s':>9} "
              f"{'vs parquet':>11} {'vs spark-iceberg':>17}")
    print(header)
    print("-" * len(header))
    medians: dict[str, float] = {}
    for aggregate in ("narrow", "wide"):
        for name in ("ours", "spark-iceberg", "parquet"):
            times = spark["times"][f"{name}/{aggregate}"]
            medians[f"{name}/{aggregate}"] = statistics.median(times)
        for name in ("ours", "spark-iceberg", "parquet"):
            times = spark["times"][f"{name}/{aggregate}"]
            median = medians[f"{name}/{aggregate}"]
            vs_parquet = medians[f"parquet/{aggregate}"] / median
            vs_theirs = medians[f"spark-iceberg/{aggregate}"] / median
            print(f"{aggregate:<9} {name:<14} {min(times):>7.3f} {median:>9.3f} "
                  f"{vs_parquet:>10.2f}x {vs_theirs:>16.2f}x")
    print("\n(ratios are speeds: the other reader's median time over this one's; target: ours "
          ">= 0.95x spark-iceberg)")
    publish = built["publish_s"]
    print(f"\npublish per snapshot (s): {', '.join(f'{s:.3f}' for s in publish)}; median "
          f"{statistics.median(publish):.3f} over {len(publish)} snapshots, "
          f"{built['files']} data files at the end")
    print(f"REST load: full {latency['full']['median_ms']:.1f} ms median "
          f"({latency['full']['p95_ms']:.1f} p95, {latency['body_bytes']:,} bytes); "
          f"304 Not Modified {latency['not_modified']['median_ms']:.1f} ms median "
          f"({latency['not_modified']['p95_ms']:.1f} p95); {args.loads} loads each")
    print(f"writes: arrowlake {built['write_s']:.1f} s, Spark's MERGE history "
          f"{spark['spark_write_s']:.1f} s")
    print("\nfiles each reader opens:")
    for name, files in (("ours", ours_files), ("spark-iceberg", theirs_files)):
        print(f"  {name:<14} {files['files']:>4} data files, {files['bytes'] / 1e6:7.1f} MB, "
              f"{files['rows']:,} rows stored, {files['row_groups']} row groups, "
              f"{', '.join(files['codecs'])}; {'; '.join(files['encodings'])}")
    print(f"  spark-iceberg delete files: {spark['spark_delete_files']}; parquet copy "
          f"{built['copy_bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
