"""Read published Iceberg metadata by path with Spark 4.1 and Iceberg's Spark runtime.

Run with the ``spark41`` environment's Python (tests/client_envs.py), without arrowlake:
``python spark_read.py REQUESTS.json``. Each request names a metadata file and optionally a
snapshot id, a timestamp (ms) or a tag; the rows go to ``<out>`` (Arrow IPC), an error to
``<out>.error``.
"""

from __future__ import annotations

import json
import sys
import traceback
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import SparkSession


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    spark = (SparkSession.builder.master("local[2]").appName("iceberg-path-test")
             .config("spark.jars.packages", spec["package"])
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for request in spec["requests"]:
            out = request["out"]
            try:
                reader = spark.read.format("iceberg")
                # Spark's own time travel options (Iceberg's snapshot-id, as-of-timestamp
                # and tag options are refused on Spark 4.1).
                if request.get("snapshot_id") is not None:
                    reader = reader.option("versionAsOf", str(request["snapshot_id"]))
                if request.get("timestamp_ms") is not None:
                    at = datetime.fromtimestamp(request["timestamp_ms"] / 1000, UTC)
                    reader = reader.option("timestampAsOf",
                                           at.strftime("%Y-%m-%d %H:%M:%S.%f"))
                if request.get("ref") is not None:
                    reader = reader.option("versionAsOf", request["ref"])
                frame = reader.load(request["metadata"])
                if request.get("sql"):
                    frame = frame.where(request["sql"])
                rows = frame.toArrow()
                with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, rows.schema) as w:
                    w.write_table(rows)
            except Exception as exc:  # reported to the test
                with open(out + ".error", "w") as f:
                    json.dump({"error": f"{type(exc).__name__}: {exc}",
                               "trace": traceback.format_exc()}, f)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
