"""A write fails, then deleting what it wrote fails too (the S3 server went away): the user sees
the write's own error, with the failed cleanup attached as a note (issue item 13)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import SchemaMismatch
from arrowlake.table.writes.plain import append_parts

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])
GOOD = pa.record_batch({"id": pa.array(range(100), pa.int64()),
                        "s": pa.array([f"v{i}" for i in range(100)])})
BAD = pa.record_batch({"id": pa.array([1], pa.int64()), "unknown": pa.array([1])})


@pytest.fixture
def outage_s3():
    """An S3 server of this test's own, so that stopping it harms no other test."""
    from tests.services import ServiceStartError, start_s3

    try:
        server = start_s3()
    except ServiceStartError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"The S3 test server could not be started here: {exc}")
    yield server
    server.stop()


@pytest.fixture
def outage_lake(outage_s3, tmp_path: Path) -> Iterator[al.Lake]:
    bucket = outage_s3.create_bucket("outage")
    options = {**outage_s3.storage_options(), "max_retries": 0, "retry_timeout": "2s",
               "connect_timeout": "2s"}
    lake = al.connect(f"sqlite:///{tmp_path}/meta.db", warehouse=f"s3://{bucket}/wh",
                      storage_options=options)
    yield lake
    lake.close()


def cleanup_notes(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", []) if "also failed" in n]


def test_item13_write_error_survives_a_failed_cleanup_of_its_files(outage_s3, outage_lake):
    # every batch goes to a file at once, so the first one is written before the failure
    t = outage_lake.create_table("t", SCHEMA, properties={"write.buffer-size": "1"})

    def batches() -> Iterator[pa.RecordBatch]:
        yield GOOD
        outage_s3.stop()  # the storage goes away while the write is under way
        yield BAD

    with pytest.raises(SchemaMismatch, match="unknown") as err:
        t.append(batches())
    notes = cleanup_notes(err.value)
    assert len(notes) == 1
    assert "remove_orphan_files" in notes[0] and "StorageError" in notes[0]


def test_item13_commit_side_cleanup_keeps_the_original_error(outage_s3, outage_lake):
    t = outage_lake.create_table("t", SCHEMA)

    def second_part() -> Iterator[pa.RecordBatch]:
        outage_s3.stop()  # the first part's files are written; now the storage is gone
        yield BAD

    with pytest.raises(SchemaMismatch, match="unknown") as err:
        append_parts(t.state, [pa.Table.from_batches([GOOD]), second_part()])
    notes = cleanup_notes(err.value)
    assert len(notes) == 1 and "Deleting the 1 file(s)" in notes[0]
    assert t.refresh().current_snapshot_id is None  # nothing was committed


def test_item13_cleanup_that_works_leaves_no_note(outage_lake):
    t = outage_lake.create_table("t", SCHEMA, properties={"write.buffer-size": "1"})

    def batches() -> Iterator[pa.RecordBatch]:
        yield GOOD
        yield BAD

    with pytest.raises(SchemaMismatch) as err:
        t.append(batches())
    assert cleanup_notes(err.value) == []
    assert [f.path for f in t._storage.list_files(t.location)] == []


def test_item13_unreachable_storage_is_not_reported_as_a_damaged_file(outage_s3, outage_lake):
    t = outage_lake.create_table("t", SCHEMA)
    t.append(GOOD)  # not read yet: no footer of it is cached
    outage_s3.stop()
    with pytest.raises(al.errors.StorageError) as err:
        t.scan(columns=["s"]).to_arrow()
    assert not isinstance(err.value, al.errors.DataFileError)
