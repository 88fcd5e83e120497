"""arrowlake on a standalone Spark cluster (a master and two worker JVMs, tests/cluster/
harness.py) against PostgreSQL and S3: executors get the lake from the read and write options,
the fast path reads S3 through S3A (hadoop-aws from spark.jars.packages), maintenance runs as
Spark jobs, and no secret shows in plans, logs, the event log or the UI."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from tests.cluster import jobs
from tests.cluster.conftest import SECRETS
from tests.conftest import put_file, sorted_rows, stored_paths
from tests.spark.helpers import bucket_files, compaction_table, same_compaction

#: Slow: a standalone cluster of its own (master, two workers in their own JVMs), 2-3 min in all.
pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("amount", pa.float64())])


def _rows(ids, amount=1.0):
    return [{"id": i, "day": f"2026-11-0{1 + i % 3}", "amount": i * amount} for i in ids]


def test_the_cluster_has_two_executors_in_their_own_jvms(cluster):
    assert len(cluster.call(jobs.executors)) == 2


def test_batch_write_and_reads_on_the_cluster(cluster, cluster_lake, pg_s3_lake):
    pg_s3_lake.create_table("c.orders", SCHEMA, partition_by=["day"])
    out = cluster.call(jobs.write_then_read, cluster_lake, "c.orders", _rows(range(30)), SCHEMA)
    expected = sorted(_rows(range(30)), key=repr)
    assert out["source"] == expected
    assert out["fast"] == expected
    # Every file through Spark's own reader, on S3 through S3A: nothing through the source.
    assert out["plan"].endswith("0 files in 0 splits through the arrowlake data source")
    assert sorted_rows(pg_s3_lake.table("c.orders").to_arrow(), "id") == sorted(
        _rows(range(30)), key=lambda r: r["id"])


def test_an_upsert_job_on_the_cluster(cluster, cluster_lake, pg_s3_lake):
    table = pg_s3_lake.create_table("c.users", SCHEMA, primary_key=["id"], buckets=2)
    table.upsert(pa.Table.from_pylist(_rows(range(10)), schema=SCHEMA))
    out = cluster.call(jobs.write_then_read, cluster_lake, "c.users",
                       _rows(range(5, 15), amount=-1.0), SCHEMA, "append", "upsert")
    expected = sorted(_rows(range(5)) + _rows(range(5, 15), amount=-1.0), key=repr)
    assert out["source"] == out["fast"] == expected
    assert sorted_rows(table.to_arrow(), "id") == sorted(expected, key=lambda r: r["id"])


def test_a_streaming_query_restarts_from_its_checkpoint(cluster, cluster_lake, pg_s3_lake,
                                                        tmp_path):
    source = pg_s3_lake.create_table("c.events", SCHEMA)
    pg_s3_lake.create_table("c.events_copy", SCHEMA)
    checkpoint = str(tmp_path / "checkpoint")
    source.append(pa.Table.from_pylist(_rows(range(5)), schema=SCHEMA))
    assert cluster.call(jobs.stream_copy, cluster_lake, "c.events", "c.events_copy",
                        checkpoint) == 1
    source.append(pa.Table.from_pylist(_rows(range(5, 8)), schema=SCHEMA))
    source.append(pa.Table.from_pylist(_rows(range(8, 12)), schema=SCHEMA))
    # A new query on the same checkpoint reads only what came after it: every row once.
    assert cluster.call(jobs.stream_copy, cluster_lake, "c.events", "c.events_copy",
                        checkpoint) >= 1
    copy = pg_s3_lake.table("c.events_copy")
    assert sorted_rows(copy.to_arrow(), "id") == sorted_rows(source.to_arrow(), "id")


def test_maintenance_jobs_on_the_cluster(cluster, cluster_lake, pg_s3_lake):
    for vectors in (False, True):
        jobs_table = compaction_table(pg_s3_lake, f"m.jobs_{vectors}", deletion_vectors=vectors)
        local = compaction_table(pg_s3_lake, f"m.local_{vectors}", deletion_vectors=vectors)
        result = cluster.call(jobs.compact, cluster_lake, f"m.jobs_{vectors}", True)
        same_compaction(result, local.compact(full=True))
        assert sorted_rows(jobs_table.to_arrow(), "id") == sorted_rows(local.to_arrow(), "id")
        assert bucket_files(jobs_table) == bucket_files(local)
    table = pg_s3_lake.table("m.jobs_False")
    orphans = {table.location + p for p in ("/data/day=d0/bucket-0/stray.parquet",
                                            "/data/day=d1/x.parquet", "/tmp-upload")}
    for path in orphans:
        put_file(table, path, b"x" * 10)
    before = stored_paths(table)
    dry = cluster.call(jobs.remove_orphans, cluster_lake, "m.jobs_False", True)
    assert dry == table.remove_orphan_files(timedelta(0))
    assert set(dry.files) >= orphans  # and the runs the compaction replaced
    done = cluster.call(jobs.remove_orphans, cluster_lake, "m.jobs_False", False)
    assert done.files == dry.files
    assert stored_paths(table) == before - set(dry.files)
    assert table.to_arrow().num_rows == 32


def test_no_secret_in_plans_logs_event_log_or_ui(cluster, cluster_lake, pg_s3_lake):
    table = pg_s3_lake.create_table("c.secretive", SCHEMA)
    table.append(pa.Table.from_pylist(_rows(range(4)), schema=SCHEMA))
    out = cluster.call(jobs.plan_texts, cluster_lake, "c.secretive")
    places = {"plan strings": "\n".join(out["plans"]), "UI": out["ui"],
              "event log": cluster.event_log(), "driver log": cluster.log(),
              **cluster.nodes.log_texts()}
    # The places do record the queries (the read's files on S3A, the data source's relation).
    assert "s3a://" in places["plan strings"] and "arrowlake" in places["plan strings"]
    assert "s3a://" in places["event log"] and "s3a://" in places["UI"]
    leaks = {(where, secret) for where, text in places.items() for secret in SECRETS
             if secret in text}
    assert not leaks
