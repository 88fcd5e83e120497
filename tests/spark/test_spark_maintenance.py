"""Maintenance as Spark jobs (arrowlake.spark.compact, remove_orphan_files) in local mode: the
same outcome as the in-process versions. tests/cluster runs them on a standalone cluster."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

import arrowlake as al
import arrowlake.spark
from arrowlake.table.maintenance import compaction
from tests.conftest import put_file, sorted_rows, stored_paths
from tests.spark.helpers import bucket_files, compaction_table, same_compaction


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["merge-on-read", "vectors"])
@pytest.mark.parametrize("full", [False, True], ids=["picked", "full"])
def test_compact_as_a_spark_job_does_what_table_compact_does(spark, tmp_path, deletion_vectors,
                                                              full):
    lake = al.connect(tmp_path / "lake")
    jobs = compaction_table(lake, "m.by_spark", deletion_vectors=deletion_vectors)
    local = compaction_table(lake, "m.in_process", deletion_vectors=deletion_vectors)
    before = jobs.current_snapshot_id
    result = arrowlake.spark.compact(spark, str(tmp_path / "lake"), "m.by_spark", full=full)
    expected = local.compact(full=full)
    same_compaction(result, expected)
    jobs.refresh()
    assert jobs.current_snapshot_id == result.snapshot_id == before + 1  # one commit
    assert jobs.snapshots().column("kind").to_pylist()[-1] == "compact"
    assert sorted_rows(jobs.to_arrow(), "id") == sorted_rows(local.to_arrow(), "id")
    assert bucket_files(jobs) == bucket_files(local)
    # Nothing is left to do, for either.
    assert arrowlake.spark.compact(spark, lake, "m.by_spark", full=full).snapshot_id is None


def test_a_full_spark_compaction_commits_the_full_compaction_changelog_with_vectors(
        spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
    made = {name: lake.create_table(name, schema, primary_key=["k"], buckets=2,
                                    deletion_vectors=True, changelog_producer="full-compaction")
            for name in ("m.by_spark", "m.in_process")}
    seen = {}
    for name, table in made.items():
        def compact(name=name, table=table):
            if name == "m.by_spark":
                return arrowlake.spark.compact(spark, lake, name, full=True)
            return table.compact(full=True)

        table.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"]})
        assert compact().snapshot_id is not None  # one file per bucket: only the changelog
        table.upsert({"k": [1, 4], "v": ["A", "d"]})
        table.delete("k = 2")
        assert compact().snapshot_id is not None
        assert compact().snapshot_id is None  # nothing changed since
        with table.stream(start="earliest", stop_at_latest=True, include_row_kind=True) as s:
            seen[name] = [(c.kind, sorted(c.to_arrow().to_pylist(), key=lambda r: r["k"]))
                          for c in s]
    assert seen["m.by_spark"] == seen["m.in_process"]
    assert [[(r["k"], r["v"], r["_row_kind"]) for r in rows]
            for _, rows in seen["m.by_spark"]] == [
        [(1, "a", "+I"), (2, "b", "+I"), (3, "c", "+I")],
        [(1, "a", "-U"), (1, "A", "+U"), (2, "b", "-D"), (4, "d", "+I")]]


def test_a_spark_compaction_that_loses_a_race_is_dropped(spark, tmp_path, monkeypatch):
    lake = al.connect(tmp_path / "lake")
    table = compaction_table(lake, "m.t")
    rows = sorted_rows(table.to_arrow(), "id")
    # An in-process compaction commits between the job's planning and its commit.
    planned = compaction.plan_compaction

    def plan_then_race(t, full=False, only=None):
        monkeypatch.setattr(compaction, "plan_compaction", planned)
        out = planned(t, full, only)
        lake.table("m.t").compact(full=True)
        return out

    monkeypatch.setattr(compaction, "plan_compaction", plan_then_race)
    result = arrowlake.spark.compact(spark, lake, "m.t", full=True)
    assert result.dropped and result.snapshot_id is None
    table.refresh()
    assert sorted_rows(table.to_arrow(), "id") == rows
    # The dropped job's files are gone: only the committed compaction's remain.
    assert table.remove_orphan_files(timedelta(0)).files == []


def test_remove_orphan_files_as_a_spark_job(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    table = compaction_table(lake, "m.t")
    table.compact(full=True)  # the compacted runs stay referenced by older snapshots
    orphans = {table.location + p for p in (
        "/data/day=d0/bucket-0/stray.parquet", "/data/day=d1/leftover.parquet",
        "/data/gone=1/bucket-3/old.parquet", "/tmp-upload")}
    for path in orphans:
        put_file(table, path, b"x" * 10)
    before = stored_paths(table)
    dry = arrowlake.spark.remove_orphan_files(spark, lake, "m.t", timedelta(0))
    assert dry == table.remove_orphan_files(timedelta(0))
    assert set(dry.files) == orphans and dry.bytes == 40 and dry.dry_run
    assert stored_paths(table) == before
    # Files younger than older_than are left: a write may still be under way.
    assert arrowlake.spark.remove_orphan_files(spark, lake, "m.t").files == []
    done = arrowlake.spark.remove_orphan_files(spark, lake, "m.t", timedelta(0), dry_run=False)
    assert set(done.files) == orphans and not done.dry_run
    assert stored_paths(table) == before - orphans
    assert table.to_arrow().num_rows == 32  # rows 3..34 of the writes
