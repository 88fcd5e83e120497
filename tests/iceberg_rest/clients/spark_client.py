"""Runs SQL through the REST catalog on PySpark 4.1 with Iceberg's Spark runtime.

Usage: python spark_client.py PLAN.json. The plan gives the catalog (uri, token, optional
extra catalog properties), the runtime package, temp views over Parquet files {name: path},
and queries {name, sql} run in order; each
answer goes to OUT/<name>.arrow (spark's toArrow) or its error to OUT/<name>.error.txt.
"""

import json
import sys
import traceback
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    out = Path(plan["out"])
    builder = (SparkSession.builder.master("local[2]").appName("iceberg-rest-test")
               .config("spark.jars.packages", plan["package"])
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", plan.get("driver_memory", "1g"))
               .config("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
               .config("spark.sql.catalog.lake.type", "rest")
               .config("spark.sql.catalog.lake.uri", plan["uri"])
               .config("spark.sql.catalog.lake.token", plan["token"]))
    for key, value in plan.get("catalog", {}).items():
        builder = builder.config(f"spark.sql.catalog.lake.{key}", value)
    for key, value in plan.get("conf", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for name, path in plan.get("views", {}).items():  # Parquet baselines, by name
        spark.read.parquet(path).createOrReplaceTempView(name)
    try:
        for query in plan["queries"]:
            try:
                result = spark.sql(query["sql"]).toArrow()
                with pa.OSFile(str(out / f"{query['name']}.arrow"), "wb") as sink, \
                        pa.ipc.new_file(sink, result.schema) as writer:
                    writer.write_table(result)
            except Exception as exc:
                (out / f"{query['name']}.error.txt").write_text(
                    f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
