"""Reads of many local files by Spark's Parquet reader list them on the driver: past 32
paths Spark would start a listing job of one task a path, which costs more than reading the
files of a small table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

import arrowlake.spark as als
from arrowlake.spark.fast import read_files

THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def _jobs_while(spark, group: str, make) -> tuple[object, int]:
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        result = make()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def test_many_local_files_are_listed_without_a_job(spark, tmp_path):
    paths = []
    for i in range(40):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(pa.table({"x": np.arange(i * 10, i * 10 + 10)}), path)
        paths.append("file://" + str(path))
    before = spark.conf.get(THRESHOLD)
    # (A schema given, as the fast path gives it: inferring one would start a job too.)
    # What Spark itself does with so many paths: the check below can see a listing job.
    _, jobs = _jobs_while(spark, "plain",
                         lambda: spark.read.schema("x long").parquet(*paths))
    assert jobs >= 1
    df, jobs = _jobs_while(spark, "driver", lambda: read_files(spark, spark.read.schema("x long"),
                                                              paths))
    assert jobs == 0
    assert spark.conf.get(THRESHOLD) == before
    assert sorted(r.x for r in df.collect()) == list(range(400))


def test_a_table_of_many_files_reads_right(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
    t = lake.create_table("s.many", schema, primary_key=["id"], buckets=1,
                          deletion_vectors=True,
                          properties={"compaction.max-runs": "100",
                                      "deletion-vectors.rewrite-threshold": "1"})
    for i in range(40):  # each write replaces a row of the first
        t.upsert({"id": [i, 1000 + i], "v": [i, i]})
    t.upsert({"id": list(range(40)), "v": [-1] * 40})
    plan = als.plan_read(spark, lake, "s.many")
    assert sum(len(g.paths) for g in plan.parquet) == len(t.files()) == 41
    rows = sorted((r.id, r.v) for r in als.read(spark, lake, "s.many").collect())
    assert rows == sorted((r["id"], r["v"]) for r in t.to_arrow().to_pylist())
    lake.close()
