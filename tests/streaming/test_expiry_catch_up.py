"""Snapshot expiry keeps what stream consumers need; fast catch-up over many snapshots."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import SnapshotNotFound, ValidationError
from tests.conftest import METASTORES, make_lake

KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
PLAIN = pa.schema([("id", pa.int64())])


@pytest.mark.parametrize("kind", METASTORES)
def test_expiry_keeps_what_a_consumer_needs_and_frees_it_once_it_moves_on(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.plain", PLAIN)
    for i in range(3):
        t.append({"id": [i]})
    stream = t.stream(consumer="slow", start="earliest", stop_at_latest=True,
                      catch_up_threshold=None)
    first = next(stream)
    stream.commit(first.snapshot_id)  # resumes at snapshot 2
    t.delete("id = 1")
    for i in range(3, 6):
        t.append({"id": [i]})  # snapshots 5..7
    result = t.expire_snapshots(retain_last=1)
    # Snapshot 1 (before what the consumer resumes at) and 2.. are needed by the consumer.
    assert result.expired_snapshots == []
    assert result.kept_for_consumers == {"slow": [1, 2, 3, 4, 5, 6]}
    assert result.deleted_files == []
    # The consumer still reads every change, including the delete's removed rows.
    got = [(c.snapshot_id, c.to_arrow().column("id").to_pylist()) for c in stream]
    assert got == [(2, [1]), (3, [2]), (4, [1]), (5, [3]), (6, [4]), (7, [5])]
    stream.commit(5)  # resumes at 6: needs 5 and on
    result = t.expire_snapshots(retain_last=1)
    assert result.expired_snapshots == [1, 2, 3, 4]
    assert result.kept_for_consumers == {"slow": [5, 6]}
    assert len(result.deleted_files) == 1  # the file the delete rewrote
    rest = [c.snapshot_id for c in t.stream(consumer="slow", stop_at_latest=True)]
    assert rest == [6, 7]

    # An idle consumer past consumer.expiration is dropped and holds nothing back.
    t.set_properties(**{"consumer.expiration": "50 ms"})
    time.sleep(0.1)
    result = t.expire_snapshots(retain_last=1)
    assert result.expired_consumers == ["slow"]
    assert result.expired_snapshots == [5, 6]
    assert t.consumers().num_rows == 0
    with pytest.raises(ValidationError, match="duration"):
        t.set_properties(**{"consumer.expiration": "soon"})
    lake.close()


def test_a_stream_behind_expired_snapshots_says_so(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    t.append({"id": [0]})
    stream = t.stream(start="latest", stop_at_latest=True, catch_up_threshold=None)
    for i in range(1, 4):
        t.append({"id": [i]})
    t.expire_snapshots(retain_last=1)  # no consumer id: nothing is kept for this stream
    with pytest.raises(SnapshotNotFound, match="expired"):
        list(stream)


def _state(t: al.Table, snapshot: int | None) -> dict[int, str]:
    if not snapshot:
        return {}
    return {r["k"]: r["v"] for r in t.scan(snapshot=snapshot).to_arrow().to_pylist()}


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
def test_catch_up_retracts_the_keys_of_buckets_an_overwrite_emptied(vectors, tmp_path):
    lake = al.connect(tmp_path / "lake")
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False),
                        pa.field("p", pa.string(), nullable=False), ("v", pa.string())])
    t = lake.create_table("s.p", schema, primary_key=["k", "p"], partition_by=["p"],
                          buckets=4, deletion_vectors=vectors)
    t.upsert({"k": list(range(8)), "p": ["a"] * 8, "v": ["x"] * 8})
    start = t.current_snapshot_id
    # Partition a's new rows land in one bucket: the others lose their files, gaining none.
    t.overwrite({"k": [0], "p": ["a"], "v": ["y"]}, filter="p = 'a'")
    t.upsert({"k": [100], "p": ["b"], "v": ["z"]})
    with t.stream(start=start + 1, catch_up_threshold=1, include_row_kind=True,
                  columns=["k"], stop_at_latest=True) as changes:
        [change] = list(changes)
    assert change.kind == "catch-up"
    assert sorted((r["k"], r["_row_kind"]) for r in change.to_arrow().to_pylist()) == [
        (0, "+U"), *((k, "-D") for k in range(1, 8)), (100, "+I")]
    lake.close()


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
@pytest.mark.parametrize("kind", METASTORES)
def test_catch_up_on_a_key_table_is_the_net_change_per_key(kind, vectors, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=3,
                          deletion_vectors=vectors)
    t.upsert({"k": [1, 2, 3, 4], "v": ["a", "b", "c", "d"]})
    stream = t.stream(consumer="c", include_row_kind=True, stop_at_latest=True)
    [full] = list(stream)
    stream.commit(full.snapshot_id)
    start = t.current_snapshot_id
    t.upsert({"k": [1], "v": ["a2"]})
    t.upsert({"k": [5], "v": ["e"]})
    t.delete("k = 2")
    t.upsert({"k": [6], "v": ["f"]})
    t.delete("k = 6")  # inserted and deleted inside the range: nothing
    t.compact(full=True)
    for i in range(6):
        t.upsert({"k": [1], "v": [f"a{i + 3}"]})
    t.upsert({"k": [3], "v": ["c"]})  # written again, same value: nothing
    end = t.current_snapshot_id
    changes = list(t.stream(consumer="c", include_row_kind=True, stop_at_latest=True))
    assert [(c.kind, c.first_snapshot_id, c.snapshot_id) for c in changes] == [
        ("catch-up", start + 1, end)]
    got = sorted(changes[0].to_arrow().to_pylist(), key=lambda r: r["k"])
    assert got == [
        {"k": 1, "v": "a8", "_row_kind": "+U"},
        {"k": 2, "v": "b", "_row_kind": "-D"},
        {"k": 5, "v": "e", "_row_kind": "+I"},
    ]
    # Applied to the state at the start, the change gives the state at the end.
    state = _state(t, start)
    for r in got:
        if r["_row_kind"] == "-D":
            del state[r["k"]]
        else:
            state[r["k"]] = r["v"]
    assert state == _state(t, end)
    # Shards split the net change between them.
    parts = [r for i in range(2) for c in t.stream(consumer=None, start=start + 1, shard=(i, 2),
                                                  include_row_kind=True, stop_at_latest=True)
             for r in c.to_arrow().to_pylist()]
    assert sorted(parts, key=lambda r: r["k"]) == got
    # Turned off: one change per snapshot (the compaction yields none).
    per_snapshot = list(t.stream(start=start + 1, catch_up_threshold=None, stop_at_latest=True))
    kinds = {r["snapshot_id"]: r["kind"] for r in t.snapshots().to_pylist()}
    assert [c.snapshot_id for c in per_snapshot] == [
        s for s in range(start + 1, end + 1) if kinds[s] != "compact"]
    lake.close()


def test_catch_up_on_an_append_table(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    for i in range(12):
        t.append({"id": [i]})
    [change] = list(t.stream(start="earliest", stop_at_latest=True, include_row_kind=True))
    assert (change.kind, change.first_snapshot_id, change.snapshot_id) == ("catch-up", 1, 12)
    assert sorted(change.to_arrow().column("id").to_pylist()) == list(range(12))
    assert set(change.to_arrow().column("_row_kind").to_pylist()) == {"+I"}
    assert len(list(t.stream(start="earliest", stop_at_latest=True,
                             catch_up_threshold=20))) == 12
    t.delete("id = 3")  # a range with a delete is read per snapshot, exactly
    kinds = [c.kind for c in t.stream(start="earliest", stop_at_latest=True)]
    assert kinds == ["append"] * 12 + ["delete"]
