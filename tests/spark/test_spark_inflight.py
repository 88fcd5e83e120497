"""A Spark write is registered in flight by the driver, and its tasks write under that
registration: orphan removal running all through the job leaves its files alone (the defects
issue's item 1)."""

from __future__ import annotations

import threading
import time
import warnings
from datetime import timedelta

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import UnsafeOrphanAge
from arrowlake.metastore.inflight import write_id_of

pytest.importorskip("pyspark")


def slow_rows(batches):
    """mapInArrow: each task hands on its rows in four parts with pauses between, as a long
    job's tasks do: its first files are written well before the job commits."""
    for batch in batches:
        step = -(-batch.num_rows // 4)
        for start in range(0, batch.num_rows, step):
            yield batch.slice(start, step)
            time.sleep(0.3)


def test_orphan_removal_during_a_spark_write_keeps_its_files(spark, tmp_path) -> None:
    lake = al.connect(tmp_path / "lake")
    table = lake.create_table("s.events", pa.schema([("id", pa.int64()), ("v", pa.string())]),
                              properties={"write.row-group-rows": "100",
                                          "write.target-file-size": "1"})
    df = (spark.range(0, 2000, numPartitions=2).selectExpr("id", "cast(id as string) as v")
          .mapInArrow(slow_rows, "id long, v string"))
    stop, deleted = threading.Event(), []

    def remove_orphans() -> None:
        other = al.connect(tmp_path / "lake").table("s.events")
        while not stop.is_set():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnsafeOrphanAge)
                deleted.extend(other.remove_orphan_files(timedelta(0), dry_run=False).files)
            time.sleep(0.05)

    remover = threading.Thread(target=remove_orphans)
    remover.start()
    try:
        (df.write.format("arrowlake").option("lake", str(tmp_path / "lake")).mode("append")
         .save("s.events"))
    finally:
        stop.set()
        remover.join()
    assert deleted == []
    table.refresh()
    assert table.scan().to_arrow().num_rows == 2000
    files = table.files().column("path").to_pylist()
    assert len(files) > 2 and {write_id_of(p) for p in files} != {None}
    assert len({write_id_of(p) for p in files}) == 1  # one registration, made by the driver
    assert lake.metastore.live_writes() == []  # ended by the commit
