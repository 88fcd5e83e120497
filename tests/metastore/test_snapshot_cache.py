"""Planning reuses what a committed snapshot reads (its live files and deletion vectors, kept
per metastore): scans must still see every later commit, from this connection or another,
and old snapshots, dropped tables and re-created lakes must read exactly what they hold."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import SnapshotNotFound
from arrowlake.metastore.snapshot_cache import SnapshotCache
from tests.conftest import METASTORES, make_lake

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string()),
                    ("v", pa.int64())])


def _other(lake: al.Lake) -> al.Lake:
    """A second connection to the same lake: stands in for another process."""
    return al.connect(lake.metastore.url, warehouse=lake.warehouse)


def _rows(table: al.Table, **scan) -> list[tuple[int, str, int]]:
    got = table.scan(**scan).to_arrow().sort_by("id")
    return list(zip(*(got.column(c).to_pylist() for c in ("id", "day", "v")), strict=True))


def _upsert(table: al.Table, ids: list[int], v: int) -> None:
    table.upsert({"id": ids, "day": ["d1" if i % 2 else "d2" for i in ids], "v": [v] * len(ids)})


def _answers_as_database(lake: al.Lake, other: al.Lake, table_id: int, snapshot_id: int
                         ) -> None:
    """``lake``'s metastore (its cache) gives the snapshot's files and vectors that ``other``'s
    database gives."""
    ms, db = lake.metastore, other.metastore
    assert ms.live_files(table_id, snapshot_id).equals(db.live_files(table_id, snapshot_id))
    assert dict(ms.live_vectors(table_id, snapshot_id)) == \
        dict(db.live_vectors(table_id, snapshot_id))


def _dv_table(lake: al.Lake, partitioned: bool = False) -> al.Table:
    return lake.create_table("t", SCHEMA, primary_key=["id", "day"] if partitioned else ["id"],
                             partition_by=["day"] if partitioned else (), buckets=4,
                             deletion_vectors=True)


@pytest.mark.parametrize("kind", METASTORES)
def test_scans_see_commits_of_another_connection(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake)
    _upsert(t, list(range(10)), 0)
    assert t.count() == 10 and t.scan(filter="id = 3").to_arrow().column("v").to_pylist() == [0]
    other = _other(lake)
    o = other.table("t")
    _upsert(o, [3, 4, 20], 1)  # replaces two rows (vectors grow), adds one
    assert t.count() == 11
    assert t.scan(filter="id = 3").to_arrow().column("v").to_pylist() == [1]
    o.delete("id = 5")  # a delete adds no file: only vectors change
    assert t.count() == 10
    assert [r[0] for r in _rows(t)] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 20]
    o.compact(full=True)
    o.expire_snapshots(older_than=None, retain_last=1)
    assert t.count() == 10
    assert {r[0]: r[2] for r in _rows(t)} == {**{i: 0 for i in (0, 1, 2, 6, 7, 8, 9)},
                                              3: 1, 4: 1, 20: 1}
    # and this connection's own commits
    _upsert(t, [0], 7)
    assert t.scan(filter="id = 0").to_arrow().column("v").to_pylist() == [7]
    other.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_old_snapshots_read_their_own_rows_after_newer_commits(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake)
    _upsert(t, [1, 2, 3], 0)
    first = t.current_snapshot_id
    before = _rows(t)  # fills the cache for the first snapshot
    _upsert(t, [2, 3], 1)
    second = t.current_snapshot_id
    assert _rows(t) == [(1, "d1", 0), (2, "d2", 1), (3, "d1", 1)]
    t.delete("id = 1")
    t.compact(full=True)  # removes the files the first two snapshots read
    assert _rows(t, snapshot=first) == before == [(1, "d1", 0), (2, "d2", 0), (3, "d1", 0)]
    assert t.scan(snapshot=first).count() == 3
    assert _rows(t, snapshot=second) == [(1, "d1", 0), (2, "d2", 1), (3, "d1", 1)]
    assert _rows(t) == [(2, "d2", 1), (3, "d1", 1)] and t.count() == 2
    # what the cache answers for an old snapshot is what the database answers
    ms, tid = lake.metastore, t._record.table_id
    fresh = _other(lake)
    for sid in (first, second, t.current_snapshot_id):
        _answers_as_database(lake, fresh, tid, sid)
    # expiry through this metastore: the expired snapshot fails, the current one reads right
    t.expire_snapshots(older_than=None, retain_last=1)
    with pytest.raises(SnapshotNotFound):
        t.scan(snapshot=first)
    assert ms.snapshot_cache.get(("files", tid, first, "data")) is None
    assert _rows(t) == [(2, "d2", 1), (3, "d1", 1)]
    fresh.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_a_snapshot_id_not_committed_yet_is_not_kept(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake)
    _upsert(t, [1, 2], 0)
    ms, tid = lake.metastore, t._record.table_id
    nxt = t.current_snapshot_id + 1
    # Asked for a snapshot that does not exist yet, the database answers with the files live
    # now; the next commit takes that id and changes them.
    assert ms.live_files(tid, nxt).num_rows == ms.live_files(tid, nxt - 1).num_rows
    other = _other(lake)
    _upsert(other.table("t"), [2, 3], 1)  # commits snapshot nxt (and may compact after it)
    assert nxt in t.snapshots().column("snapshot_id").to_pylist()
    _answers_as_database(lake, other, tid, nxt)
    assert len(ms.live_vectors(tid, nxt)) == 1  # key 2's first version, marked deleted
    assert t.count() == 3
    other.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_a_table_dropped_and_created_again_reads_its_new_rows(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake)
    _upsert(t, [1, 2, 3], 0)
    assert t.count() == 3
    lake.drop_table("t")
    t = _dv_table(lake)
    _upsert(t, [7], 5)
    assert t.count() == 1 and _rows(t) == [(7, "d1", 5)]
    # dropped and created again by another connection, while this one holds the old name
    other = _other(lake)
    other.drop_table("t")
    _upsert(_dv_table(other), [8, 9], 6)
    assert lake.table("t").count() == 2
    assert _rows(lake.table("t")) == [(8, "d2", 6), (9, "d1", 6)]
    other.close()
    lake.close()


def test_a_lake_deleted_and_created_again_at_the_same_path_reads_its_new_rows(tmp_path):
    path = tmp_path / "lake"
    for v in (1, 2):
        lake = al.connect(path)
        t = _dv_table(lake)
        _upsert(t, [1, 2, 3], 0)
        _upsert(t, [2, 3], v)  # the same table and snapshot ids both times
        assert t.count() == 3
        assert _rows(t) == [(1, "d1", 0), (2, "d2", v), (3, "d1", v)]
        lake.close()
        shutil.rmtree(path)


def test_the_cache_keeps_to_its_bounds(tmp_path):
    lake = al.connect(tmp_path / "lake")
    lake.metastore.snapshot_cache = cache = SnapshotCache(max_rows=12, max_entries=3)
    t = _dv_table(lake)
    for i in range(8):
        _upsert(t, list(range(i, i + 4)), i)
        assert t.count() == i + 4
        assert cache.rows <= 12 and len(cache) <= 3
    sids = t.snapshots().column("snapshot_id").to_pylist()
    other = _other(lake).table("t")
    for sid in sids:  # every snapshot read again: older ones were evicted, and are refetched
        assert _rows(t, snapshot=sid) == _rows(other, snapshot=sid)
        assert cache.rows <= 12 and len(cache) <= 3
    # an entry above the bound itself is not kept
    lake.metastore.snapshot_cache = small = SnapshotCache(max_rows=2)
    assert t.count() == 11
    assert small.get(("files", t._record.table_id, sids[-1], "data")) is None
    lake.close()


def test_least_recently_used_entries_leave_first():
    cache = SnapshotCache(max_rows=10, max_bytes=1000, max_entries=3)
    for sid in (1, 2, 3):
        cache.put(("files", 1, sid), sid, 3, 10)
    assert cache.get(("files", 1, 1)) == 1  # now the most recently used
    cache.put(("files", 1, 4), 4, 3, 10)
    assert cache.get(("files", 1, 2)) is None and cache.get(("files", 1, 1)) == 1
    cache.put(("files", 2, 1), 5, 4, 10)  # 13 rows: the oldest leaves
    assert cache.get(("files", 1, 3)) is None and cache.rows == 10 and len(cache) == 3
    cache.put(("files", 2, 2), 6, 1, 990)  # bytes bound
    assert cache.bytes <= 1000 and cache.get(("files", 2, 2)) == 6
    cache.discard(2)
    assert cache.get(("files", 2, 2)) is None and cache.get(("files", 2, 1)) is None


@pytest.mark.parametrize("kind", METASTORES)
def test_partition_and_bucket_selections_equal_the_databases(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake, partitioned=True)
    for v in range(4):
        _upsert(t, list(range(v, 24, 2 + v)), v)
    t.delete("id = 9 and day = 'd1'")
    ms, tid = lake.metastore, t._record.table_id
    fresh = _other(lake).metastore  # nothing cached: selections are answered in SQL
    parts = [p for p, _, _ in ms.partitions(tid)]
    assert len(parts) == 2
    with_vectors = 0
    for sid in t.snapshots().column("snapshot_id").to_pylist():
        whole = ms.live_files(tid, sid)  # kept: what follows selects from it
        assert whole.num_rows and ms.snapshot_cache.get(("files", tid, sid, "data")) is not None
        for pids, buckets in [(parts[:1], None), (None, [0, 2]), (parts[1:], [1, 3]),
                              (parts, [3]), ([], None), (None, []), ([10 ** 6], [0])]:
            cached = ms.live_files(tid, sid, pids, buckets)
            assert cached.equals(fresh.live_files(tid, sid, pids, buckets)), (sid, pids, buckets)
        ids = whole.column("file_id").to_pylist()
        with_vectors += len(ms.live_vectors(tid, sid)) > 0
        for chosen in (ids, ids[::3], [], [10 ** 9]):
            assert dict(ms.live_vectors(tid, sid, chosen)) == \
                dict(fresh.live_vectors(tid, sid, chosen))
    assert with_vectors >= 2
    with pytest.raises(TypeError):
        ms.live_vectors(tid, t.current_snapshot_id)[1] = None  # type: ignore[index]  # shared: read-only
    fresh.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_a_commit_keeps_its_snapshot_derived_from_its_parents(kind, tmp_path, request):
    """A commit through this metastore derives its snapshot's entries from its parent's and
    what it recorded (no query for them at the next plan); each must equal the database's
    answer, whatever kind of commit made it: first write, upserts, deletes, appends and
    overwrites of an append table, compaction, a lake transaction, a commit rebased over
    another connection's."""
    lake = make_lake(kind, tmp_path, request)
    ms = lake.metastore
    t = _dv_table(lake, partitioned=True)
    plain = lake.create_table("plain", SCHEMA)
    other = _other(lake)
    seeded: list[bool] = []

    def check(table: al.Table) -> None:
        tid, sid = table._record.table_id, table.current_snapshot_id
        seeded.append(ms.snapshot_cache.get(("files", tid, sid, "data")) is not None
                      and ms.snapshot_cache.get(("vectors", tid, sid)) is not None)
        _answers_as_database(lake, other, tid, sid)

    for v in range(6):
        _upsert(t, list(range(v, 40, 1 + v)), v)
        check(t)
    t.delete("id < 5 and day = 'd1'")
    check(t)
    plain.append({"id": [1, 2], "day": ["a", "b"], "v": [1, 2]})
    check(plain)
    plain.append({"id": [3], "day": ["c"], "v": [3]})
    check(plain)
    plain.overwrite({"id": [9], "day": ["z"], "v": [9]})
    check(plain)
    t.compact(full=True)
    check(t)
    with lake.transaction() as tx:
        tx.table("t").upsert({"id": [1, 50], "day": ["d1", "d2"], "v": [8, 8]})
        tx.table("plain").append({"id": [4], "day": ["d"], "v": [4]})
    check(t)
    check(plain)
    _upsert(other.table("t"), [2, 3], 11)  # another connection's commit: not derived here
    _upsert(t, [4, 6], 12)
    check(t)
    assert {r[0]: r[2] for r in _rows(t) if r[0] in (1, 2, 4, 50)} == {1: 8, 2: 11, 4: 12,
                                                                       50: 8}
    # Kept for every commit but the last, whose parent (the other connection's snapshot) its
    # plan read only in part: nothing to derive from.
    assert seeded == [True] * 13 + [False]
    other.close()
    lake.close()
