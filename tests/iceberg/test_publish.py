"""Publishing: incremental (manifests reused, rewritten only where they lost files, merged
now and then), idempotent, atomic under concurrent publishers, refused with the reason where
a table has no view, and known to expiry, orphan removal and purges."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import NoIcebergView, ReadOnlyLake, SnapshotNotFound
from arrowlake.iceberg import avro, publish, published
from arrowlake.iceberg import publisher as publish_module
from arrowlake.metastore import tables as t

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": np.arange(start, start + n), "name": [f"n{i}" for i in
                                                                  range(start, start + n)]},
                    SCHEMA)


def _metadata_files(table: al.Table) -> set[str]:
    folder = Path(table.location) / "metadata"
    return {str(p) for p in folder.iterdir()} if folder.exists() else set()


def _recorded(table: al.Table) -> set[str]:
    store = table._metastore
    return {table._storage.join(table.location, p)
            for p in store.iceberg_file_paths(table._record.table_id)}


def _manifests(table: al.Table) -> list[dict]:
    with table._metastore.engine.connect() as conn:
        rows = conn.execute(t.iceberg_manifests.select().where(
            t.iceberg_manifests.c.table_id == table._record.table_id)).all()
    return [dict(r._mapping) for r in rows]


def test_each_snapshot_adds_one_manifest_and_reuses_the_others(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    written = []
    for i in range(5):
        events.append(_rows(i * 10, 10))
        before = _metadata_files(events)
        publish(events)
        written.append(len(_metadata_files(events) - before))
    # A manifest, a manifest list and a metadata file per snapshot, whatever the table's size.
    assert written == [3, 3, 3, 3, 3]
    manifests = _manifests(events)
    assert len(manifests) == 5 and all(m["removed_snapshot"] is None for m in manifests)
    assert _metadata_files(events) == _recorded(events)


def test_publishing_again_writes_nothing_and_returns_the_same_metadata(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    events.append(_rows(0, 10))
    first = publish(events)
    files = _metadata_files(events)
    again = publish(events)
    assert again.metadata_location == first.metadata_location
    assert again.metadata == first.metadata
    assert events.iceberg_metadata_location() == first.metadata_location
    assert _metadata_files(events) == files
    # A tag changes the metadata (a ref), not the manifests.
    events.create_tag("v1")
    tagged = publish(events)
    assert tagged.metadata_location != first.metadata_location
    assert tagged.metadata["refs"]["v1"] == {"snapshot-id": events.current_snapshot_id,
                                             "type": "tag"}
    assert len(_metadata_files(events) - files) == 1


def test_a_removed_file_rewrites_only_its_manifest(sqlite_lake):
    schema = pa.schema([("id", pa.int64()), ("part", pa.string())])
    events = sqlite_lake.create_table("shop.events", schema, partition_by=["part"])
    for i in range(2):  # 3 files (one per partition) in each snapshot
        events.append(pa.table({"id": list(range(i * 30, i * 30 + 30)),
                                "part": ["a", "b", "c"] * 10}, schema))
    publish(events)
    events.delete("part = 'a' and id < 30")  # one file of the first snapshot, whole
    publish(events)
    manifests = _manifests(events)
    removed = [m for m in manifests if m["removed_snapshot"] is not None]
    assert [(m["added_snapshot"], m["added_files"]) for m in removed] == [(1, 3)]
    new = [m for m in manifests if m["added_snapshot"] == events.current_snapshot_id]
    # The first snapshot's manifest without the file, and the delete's own (its DELETED
    # entry); the second snapshot's manifest is used as it is.
    assert sorted((m["existing_files"], m["deleted_files"]) for m in new) == [(0, 1), (2, 0)]
    assert [m["removed_snapshot"] for m in manifests if m["added_snapshot"] == 2] == [None]


def test_small_manifests_are_merged(sqlite_lake, monkeypatch):
    monkeypatch.setattr(publish_module, "MERGE_MIN_COUNT", 4)
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    for i in range(6):
        events.append(_rows(i * 10, 10))
        publish(events)
    live = [m for m in _manifests(events) if m["removed_snapshot"] is None]
    # Merged when the fourth small manifest came: one of 4 files, then two of one each.
    assert sorted(m["existing_files"] + m["added_files"] for m in live) == [1, 1, 4]


def test_the_first_publication_covers_the_whole_history(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    for i in range(3):
        events.append(_rows(i * 10, 10))
    events.delete("id < 5")
    metadata = publish(events).metadata
    assert [s["snapshot-id"] for s in metadata["snapshots"]] == [1, 2, 3, 4]
    assert [s["summary"]["operation"] for s in metadata["snapshots"]] == \
        ["append", "append", "append", "overwrite"]
    assert [e["snapshot-id"] for e in metadata["snapshot-log"]] == [1, 2, 3, 4]
    assert metadata["current-snapshot-id"] == 4
    assert metadata["next-row-id"] == 30 + 5  # the rewritten file's 5 rows got new ids
    assert [s["first-row-id"] for s in metadata["snapshots"]] == [0, 10, 20, 30]
    # Time travel publishes the table as of an older snapshot, in its schema.
    old = publish(events, 2)
    assert old.snapshot_id == 2 and old.metadata["current-snapshot-id"] == 2
    assert [s["snapshot-id"] for s in old.metadata["snapshots"]] == [1, 2]
    assert published(events, 2) == old
    assert published(events).snapshot_id == 4
    with pytest.raises(SnapshotNotFound):
        publish(events, 99)


def test_concurrent_publishers_leave_one_current_metadata(sqlite_lake, tmp_path):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    for i in range(5):
        events.append(_rows(i * 10, 10))
    lakes = [al.connect(tmp_path / "lake") for _ in range(4)]
    results: list = []
    errors: list = []
    start = threading.Barrier(len(lakes))

    def run(lake: al.Lake) -> None:
        try:
            start.wait()
            results.append(publish(lake.table("shop.events")))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lake,)) for lake in lakes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for lake in lakes:
        lake.close()
    assert errors == []
    # Every publisher returned the one metadata that was recorded, and no file of the losers
    # is left behind.
    assert {r.metadata_location for r in results} == {published(events).metadata_location}
    assert _metadata_files(events) == _recorded(events)
    assert len(_manifests(events)) == 5  # one per snapshot: none written twice


def test_the_loser_of_a_race_deletes_its_files_and_returns_the_winners(sqlite_lake, tmp_path,
                                                                        monkeypatch):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    for i in range(3):
        events.append(_rows(i * 10, 10))
    other = al.connect(tmp_path / "lake")
    store = sqlite_lake.metastore
    record = store.record_iceberg_publication
    lost: list = []

    def racing(table_id, new):  # another publisher records just before this one
        if not lost:
            lost.append((new, _metadata_files(events)))
            winners.append(publish(other.table("shop.events")))
        return record(table_id, new)

    winners: list = []
    monkeypatch.setattr(store, "record_iceberg_publication", racing)
    found = publish(events)
    other.close()
    (new, written), (winner,) = lost[0], winners
    assert len(new.manifests) == 3 and len(written) == 7  # the loser had written its files
    assert found == winner == published(events)
    assert _metadata_files(events) == _recorded(events)  # and deleted them all


def test_merge_on_read_tables_have_no_view_and_say_how_to_switch(sqlite_lake):
    users = sqlite_lake.create_table("crm.users", SCHEMA, primary_key=["id"],
                                     deletion_vectors=False)
    users.upsert(_rows(0, 10))
    users.upsert(_rows(5, 10))
    with pytest.raises(NoIcebergView, match=r"merge-on-read.*compact\(full=True\).*"
                                            r"deletion-vectors.enabled"):
        users.iceberg_metadata_location()
    with pytest.raises(NoIcebergView):
        published(users)
    status = users.health().iceberg
    assert status is not None and not status.view and "merge-on-read" in status.reason
    users.compact(full=True)
    users.set_properties(**{"deletion-vectors.enabled": "true"})
    switch = users.current_snapshot_id  # the compaction's: both modes read it alike
    users.upsert(_rows(8, 10))
    metadata = publish(users).metadata
    # Only the snapshots read with deletion vectors (from the switch on) are published.
    after = [h["snapshot_id"] for h in users.history() if h["snapshot_id"] >= switch]
    assert [s["snapshot-id"] for s in metadata["snapshots"]] == after and len(after) >= 2
    assert users.health().iceberg.view


@pytest.mark.parametrize("typ", [pa.uint32(), pa.duration("s"), pa.float16()])
def test_a_column_of_a_type_iceberg_lacks_is_named(sqlite_lake, typ):
    table = sqlite_lake.create_table("shop.odd", pa.schema([("id", pa.int64()),
                                                             ("odd", typ)]))
    with pytest.raises(NoIcebergView, match=r"column 'odd' has type"):
        publish(table)
    status = table.health().iceberg
    assert not status.view and "'odd'" in status.reason


def test_a_widening_iceberg_cannot_read_leaves_out_the_snapshots_it_affects(sqlite_lake):
    table = sqlite_lake.create_table("shop.w", pa.schema([("id", pa.int64()),
                                                          ("n", pa.int32())]))
    table.append(pa.table({"id": [1], "n": pa.array([1], pa.int32())}))
    table.alter_column("n", pa.float64())  # int to double: not an Iceberg promotion
    table.append(pa.table({"id": [2], "n": [2.5]}))
    with pytest.raises(NoIcebergView, match=r"column 'n'.*int.*double.*Rewrite those files"):
        publish(table)
    table.overwrite(table.to_arrow())  # every file written again, as double
    metadata = publish(table).metadata
    assert [s["snapshot-id"] for s in metadata["snapshots"]] == [1, 3]


@pytest.mark.filterwarnings("ignore:older_than")
def test_expiry_removes_what_only_expired_snapshots_used(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    for i in range(4):
        events.append(_rows(i * 10, 10))
        publish(events)
    events.delete("id < 10")
    publish(events)
    assert _metadata_files(events) == _recorded(events)
    result = events.expire_snapshots(retain_last=1)
    assert result.expired_snapshots == [1, 2, 3, 4]
    files = _metadata_files(events)
    assert files == _recorded(events)
    assert {p for p in result.deleted_files if "/metadata/" in p}.isdisjoint(files)
    # The current metadata listed the expired snapshots: it is gone too, until the next
    # publication, which lists the one snapshot left.
    assert published(events) is None
    current = publish(events)
    assert [s["snapshot-id"] for s in current.metadata["snapshots"]] == [5]
    # Its metadata and manifest list, the manifests of snapshots 2 to 4, and snapshot 5's own
    # (the DELETED entry of the first file); the first snapshot's manifest is gone.
    assert len(_metadata_files(events)) == 6 and _metadata_files(events) == _recorded(events)
    # Orphan removal keeps every recorded file; purge takes them all.
    assert events.remove_orphan_files(timedelta(0), dry_run=True).files == []
    folder = Path(events.location)
    sqlite_lake.drop_table("shop.events", purge=True)
    assert not (folder / "metadata").exists() or not any((folder / "metadata").iterdir())


@pytest.mark.filterwarnings("ignore:older_than")
def test_orphan_removal_takes_unrecorded_metadata_files(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    events.append(_rows(0, 10))
    publish(events)
    stray = Path(events.location) / "metadata" / "left-by-a-crashed-publisher.avro"
    stray.write_bytes(b"x")
    found = events.remove_orphan_files(timedelta(0), dry_run=False).files
    assert found == [str(stray)]
    assert _metadata_files(events) == _recorded(events)


def test_a_read_only_lake_serves_what_was_published(tmp_path):
    lake = al.connect(tmp_path / "lake")
    events = lake.create_table("shop.events", SCHEMA)
    events.append(_rows(0, 10))
    before = publish(events)
    events.append(_rows(10, 10))
    lake.close()
    database = tmp_path / "lake" / "arrowlake.db"
    ro = al.connect(f"sqlite:///file:{database}?mode=ro&uri=true",
                    warehouse=str(tmp_path / "lake"))
    table = ro.table("shop.events")
    assert published(table) == before  # what was published, not the newer snapshot
    with pytest.raises(ReadOnlyLake, match="arrowlake iceberg shop.events"):
        publish(table)
    assert publish(table, before.snapshot_id) == before  # nothing to write for it
    ro.close()


def test_an_empty_table_has_metadata_without_snapshots(sqlite_lake):
    events = sqlite_lake.create_table("shop.events", SCHEMA)
    found = publish(events)
    assert found.snapshot_id is None and found.metadata["snapshots"] == []
    assert found.metadata["current-snapshot-id"] is None


def test_avro_longs_are_zigzag_varints():
    # The examples of Avro's specification.
    cases = {0: b"\x00", -1: b"\x01", 1: b"\x02", -2: b"\x03", 2: b"\x04", -64: b"\x7f",
             64: b"\x80\x01", 2**63 - 1: b"\xfe" + b"\xff" * 8 + b"\x01"}
    for value, encoded in cases.items():
        buf = bytearray()
        avro.write_long(buf, value)
        assert bytes(buf) == encoded, value
    data = avro.container({"type": "record", "name": "r", "fields": [
        {"name": "a", "type": "long"}]}, [{"a": 1}], metadata={"k": "v"})
    assert avro.header(data)["k"] == b"v"
