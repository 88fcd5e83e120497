"""Primary-key tables: validation, layout, merge-on-read, pruning, engines, MERGE, compaction."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.errors import SchemaMismatch, ValidationError

SCHEMA = pa.schema([("id", pa.int64()), ("email", pa.string()), ("clicks", pa.int64()),
                    ("ts", pa.int64())])


def rows(ids, email="e", clicks=1, ts=0):
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "email": [f"{email}{i}" for i in ids],
                     "clicks": pa.array([clicks] * n, pa.int64()),
                     "ts": pa.array([ts] * n, pa.int64())})


def read_file(table, path):
    """A data file read straight from storage (local disk or S3), bypassing the merge."""
    return pq.read_table(pa.BufferReader(table._storage.read_bytes(path)))


def current(table, key="id"):
    return {r[key]: r for r in table.to_arrow().to_pylist()}


@pytest.fixture
def users(lake):
    return lake.create_table("crm.users", SCHEMA, primary_key=["id"], buckets=4)


@pytest.fixture
def mor_users(lake):
    """Merge-on-read: compaction merges the runs writes leave."""
    return lake.create_table("crm.users", SCHEMA, primary_key=["id"], buckets=4,
                             deletion_vectors=False)


def test_upsert_replaces_by_key_and_dedupes_within_a_write(users):
    users.upsert(rows([1, 2, 3], "a"))
    users.upsert(pa.concat_tables([rows([2], "b"), rows([2], "c"), rows([4], "d")]))
    got = current(users)
    assert sorted(got) == [1, 2, 3, 4]
    assert got[2]["email"] == "c2"  # the last version in input order wins
    assert got[1]["email"] == "a1"
    assert users.count() == 4


def test_append_on_a_key_table_is_an_upsert(users):
    users.append(rows([1], "a"))
    users.append(rows([1], "b"))
    assert [r["email"] for r in users.to_arrow().to_pylist()] == ["b1"]


def test_runs_are_sorted_unique_and_bucketed(users):
    users.upsert(rows(list(range(200))[::-1]))
    files = users.files()
    assert files.num_rows == 4 and sorted(files["bucket"].to_pylist()) == [0, 1, 2, 3]
    for path, bucket in zip(files["path"].to_pylist(), files["bucket"].to_pylist(), strict=True):
        assert f"/bucket-{bucket}/" in path
        ids = read_file(users, path)["id"].to_pylist()
        assert ids == sorted(set(ids))
    from arrowlake.merge.bucketing import bucket_of

    for path, bucket in zip(files["path"].to_pylist(), files["bucket"].to_pylist(), strict=True):
        data = read_file(users, path)
        assert set(bucket_of(data, ["id"], 4).to_pylist()) == {bucket}


def test_delete_writes_tombstones_without_rewriting(users):
    users.upsert(rows(range(10)))
    before = set(users.files()["path"].to_pylist())
    res = users.delete(al.col("id").isin([3, 7]))
    assert res.removed_rows == 2
    assert set(users.files()["path"].to_pylist()) >= before  # nothing rewritten
    assert sorted(current(users)) == [0, 1, 2, 4, 5, 6, 8, 9]
    users.delete("clicks = 1 and id > 7")
    assert sorted(current(users)) == [0, 1, 2, 4, 5, 6]
    users.upsert(rows([3]))  # a deleted key can come back
    assert 3 in current(users)


def test_non_key_filter_is_applied_after_the_merge(users):
    users.upsert(rows([1, 2], "old"))
    users.upsert(rows([1], "new"))
    # The first run still holds email 'old1'; pruning or filtering it before the merge would
    # resurrect key 1 in its old version.
    got = users.scan(filter="email = 'old1'").to_arrow()
    assert got.num_rows == 0
    assert users.scan(filter="email = 'new1'").to_arrow()["id"].to_pylist() == [1]
    assert users.scan(filter="email = 'old1'").count() == 0


def test_key_filters_prune_buckets_and_files(users):
    users.upsert(rows(range(1000)))
    users.upsert(rows(range(500, 600)))
    scan = users.scan(filter="id = 42")
    files = scan.files()
    assert len(set(files["bucket"].to_pylist())) == 1
    assert scan.to_arrow()["id"].to_pylist() == [42]
    assert users.scan(filter=al.col("id").isin([1, 2, 3])).count() == 3
    rng = users.scan(filter="id between 1000 and 2000").files()
    assert rng.num_rows == 0  # no file's key range reaches 1000


def test_sequence_field_orders_versions(lake):
    t = lake.create_table("crm.s", SCHEMA, primary_key=["id"], buckets=2,
                          sequence_field="ts")
    t.upsert(rows([1], "late", ts=10))
    t.upsert(rows([1], "early", ts=5))  # committed later, but older by ts
    assert current(t)[1]["email"] == "late1"
    t.upsert(rows([1], "tie", ts=10))  # equal ts: commit order breaks the tie
    assert current(t)[1]["email"] == "tie1"


def test_write_changes_with_strings_and_codes(users):
    users.upsert(rows([1, 2, 3]))
    cdc = rows([1, 2, 2, 4], "x").append_column("op", pa.array(["-D", "-U", "+U", "+I"]))
    users.write_changes(cdc, row_kind="op")
    got = current(users)
    assert sorted(got) == [2, 3, 4] and got[2]["email"] == "x2"
    codes = rows([3]).append_column("kind", pa.array([3], pa.int8()))
    users.write_changes(codes, row_kind="kind")
    assert sorted(current(users)) == [2, 4]
    bad = rows([5]).append_column("op", pa.array(["+X"]))
    with pytest.raises(ValidationError, match="unknown row kind"):
        users.write_changes(bad)
    with pytest.raises(ValidationError, match="no row-kind column"):
        users.write_changes(rows([5]), row_kind="op")


def test_partial_update(lake):
    t = lake.create_table("crm.p", SCHEMA, primary_key=["id"], merge_engine="partial-update")
    t.upsert(pa.table({"id": [1], "email": ["a"], "clicks": [None], "ts": [1]},
                      schema=SCHEMA))
    t.upsert(pa.table({"id": [1], "email": [None], "clicks": [7], "ts": [None]}, schema=SCHEMA))
    assert current(t)[1] == {"id": 1, "email": "a", "clicks": 7, "ts": 1}
    t.delete("id = 1")
    assert current(t) == {}


def test_aggregation(lake):
    t = lake.create_table("crm.a", SCHEMA, primary_key=["id"], merge_engine="aggregation",
                          aggregations={"clicks": "sum", "ts": "max"})
    t.upsert(rows([1, 2], "a", clicks=1, ts=5))
    t.upsert(rows([1], "b", clicks=10, ts=3))
    got = current(t)
    assert got[1]["clicks"] == 11 and got[1]["ts"] == 5 and got[1]["email"] == "b1"
    t.compact(full=True)
    assert current(t)[1]["clicks"] == 11


def test_first_row(lake):
    t = lake.create_table("crm.f", SCHEMA, primary_key=["id"], merge_engine="first-row")
    t.upsert(rows([1], "first"))
    t.upsert(rows([1, 2], "second"))
    got = current(t)
    assert got[1]["email"] == "first1" and got[2]["email"] == "second2"


def test_merge_into(users):
    users.upsert(rows([1, 2, 3], "t", ts=5))
    source = pa.table({"id": pa.array([1, 2, 3, 9], pa.int64()),
                       "email": ["s1", "s2", "s3", "s9"], "clicks": pa.array([0] * 4, pa.int64()),
                       "ts": pa.array([9, 1, 9, 9], pa.int64()),
                       "gone": [False, False, True, False]})
    result = (users.merge(source, on="id")
              .when_matched_delete(where="source.gone")
              .when_matched_update(set={"email": "source.email"}, where="source.ts > target.ts")
              .when_not_matched_insert()
              .execute())
    assert (result.inserted, result.updated, result.deleted, result.unchanged) == (1, 1, 1, 1)
    got = current(users)
    assert sorted(got) == [1, 2, 9]
    assert got[1]["email"] == "s1" and got[1]["ts"] == 5  # only email was set
    assert got[2]["email"] == "t2"  # condition false: unchanged
    assert got[9]["clicks"] == 0


def test_merge_update_without_set_takes_the_source_row(users):
    users.upsert(rows([1], "t"))
    (users.merge(rows([1], "s", clicks=3), on="id").when_matched_update().execute())
    assert current(users)[1] == {"id": 1, "email": "s1", "clicks": 3, "ts": 0}


def test_merge_rejects_duplicate_source_keys(users):
    with pytest.raises(ValidationError, match="more than once"):
        users.merge(rows([1, 1]), on="id").when_not_matched_insert().execute()
    with pytest.raises(ValidationError, match="primary key"):
        users.merge(rows([1]), on="email")


def test_full_compaction_keeps_contents_and_history(users):
    for i in range(4):
        users.upsert(rows(range(i * 10, i * 10 + 30), f"v{i}"))
    users.delete("id < 5")
    before = users.to_arrow().sort_by("id")
    snap = users.current_snapshot_id
    result = users.compact(full=True)
    assert result.snapshot_id == snap + 1 and not result.dropped
    files = users.files()
    assert files.num_rows == len(set(files["bucket"].to_pylist()))  # one run per bucket
    assert users.to_arrow().sort_by("id").equals(before)
    assert users.scan(snapshot=snap).to_arrow().sort_by("id").equals(before)
    assert users.compact(full=True).snapshot_id is None  # nothing left to do


def test_commits_trigger_compaction_over_max_runs(lake):
    t = lake.create_table("crm.m", SCHEMA, primary_key=["id"], buckets=1,
                          properties={"compaction.max-runs": "3"})
    for i in range(6):
        t.upsert(rows([1, 2, i + 10], f"v{i}"))
        assert t.files().num_rows <= 3
    assert sorted(current(t)) == [1, 2, 10, 11, 12, 13, 14, 15]
    assert current(t)[1]["email"] == "v51"
    assert "compact" in t.snapshots()["kind"].to_pylist()


def test_compaction_that_loses_a_race_is_dropped(mor_users, monkeypatch):
    mor_users.upsert(rows(range(20), "a"))
    mor_users.upsert(rows(range(10), "b"))
    expected = mor_users.to_arrow().sort_by("id")
    from arrowlake.table.maintenance import compaction

    original = compaction._write_compacted
    state = {"raced": False}

    def racing(table, merged, runs, *rest):
        if not state["raced"]:
            state["raced"] = True
            other = al.Table(table.catalog, table.record)
            monkeypatch.setattr(compaction, "_write_compacted", original)
            assert other.compact(full=True).snapshot_id is not None
            monkeypatch.setattr(compaction, "_write_compacted", racing)
        return original(table, merged, runs, *rest)

    monkeypatch.setattr(compaction, "_write_compacted", racing)
    result = mor_users.compact(full=True)
    assert result.dropped and result.snapshot_id is None
    assert mor_users.to_arrow().sort_by("id").equals(expected)
    from datetime import timedelta

    assert mor_users.remove_orphan_files(older_than=timedelta(0)).files == []


def test_compaction_failing_in_one_bucket_leaves_no_files(mor_users, monkeypatch):
    # Buckets are merged concurrently: when one fails, the others' files (written or being
    # written) are deleted, and the table is as it was.
    mor_users.upsert(rows(range(40), "a"))
    mor_users.upsert(rows(range(0, 40, 2), "b"))
    expected = mor_users.to_arrow().sort_by("id")
    snapshot = mor_users.current_snapshot_id
    from arrowlake.table.maintenance import compaction

    original = compaction.merge_bucket
    calls = []

    def failing(split, files, *args, **kwargs):
        calls.append(files)
        if len(calls) == 2:
            raise OSError("disk gone")
        return original(split, files, *args, **kwargs)

    monkeypatch.setattr(compaction, "merge_bucket", failing)
    with pytest.raises(OSError, match="disk gone"):
        mor_users.compact(full=True)
    assert len(calls) >= 2
    assert mor_users.current_snapshot_id == snapshot
    assert mor_users.to_arrow().sort_by("id").equals(expected)
    from datetime import timedelta

    assert mor_users.remove_orphan_files(older_than=timedelta(0)).files == []


def test_partitioned_key_table(lake):
    schema = pa.schema([("day", pa.string()), ("id", pa.int64()), ("v", pa.int64())])
    t = lake.create_table("crm.pk", schema, primary_key=["day", "id"], partition_by=["day"],
                          buckets=2)
    t.upsert(pa.table({"day": ["a", "a", "b"], "id": [1, 2, 1], "v": [1, 2, 3]}))
    t.upsert(pa.table({"day": ["a"], "id": [1], "v": [10]}))
    got = {(r["day"], r["id"]): r["v"] for r in t.to_arrow().to_pylist()}
    assert got == {("a", 1): 10, ("a", 2): 2, ("b", 1): 3}
    assert t.scan(filter="day = 'b'").files().num_rows == 1
    t.overwrite(pa.table({"day": ["a"], "id": [5], "v": [5]}), filter="day = 'a'")
    got = {(r["day"], r["id"]): r["v"] for r in t.to_arrow().to_pylist()}
    assert got == {("a", 5): 5, ("b", 1): 3}
    with pytest.raises(ValidationError, match="partition columns"):
        t.overwrite(pa.table({"day": ["a"], "id": [5], "v": [5]}), filter="id = 5")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"primary_key": ["nope"]}, al.ColumnNotFound, "nope"),
    ({"primary_key": ["id"], "merge_engine": "magic"}, ValidationError, "Unknown merge_engine"),
    ({"primary_key": ["id"], "merge_engine": "aggregation",
      "aggregations": {"email": "sum"}}, SchemaMismatch, "sum"),
    ({"primary_key": ["id"], "partition_by": ["email"]}, ValidationError,
     "must be part of the primary key"),
    ({"primary_key": ["id"], "buckets": 0}, ValidationError, "buckets"),
    ({"primary_key": ["id"], "sequence_field": "email"}, SchemaMismatch, "sequence_field"),
    ({"merge_engine": "first-row"}, ValidationError, "need a primary_key"),
    ({"primary_key": ["id"], "colour": "red"}, ValidationError, "Unknown table options"),
])
def test_bad_definitions_are_refused(lake, kwargs, error, match):
    with pytest.raises(error, match=match):
        lake.create_table("crm.bad", SCHEMA, **kwargs)
    assert lake.tables() == []


def test_null_keys_and_key_changes_are_refused(users):
    with pytest.raises(SchemaMismatch, match="'id' is not nullable"):
        users.upsert(pa.table({"id": pa.array([1, None], pa.int64()), "email": ["a", "b"]}))
    assert users.current_snapshot_id is None
    with pytest.raises(SchemaMismatch, match="primary key"):
        users.drop_column("id")
    with pytest.raises(SchemaMismatch, match="primary key"):
        users.rename_column("id", "uid")
    with pytest.raises(ValidationError, match="primary-key"):
        users.alter_column("id", pa.int64())
    with pytest.raises(ValidationError, match="cannot be changed"):
        users.set_properties(**{"merge-engine": "first-row"})


def test_upsert_needs_a_key(lake):
    t = lake.create_table("crm.plain", SCHEMA)
    with pytest.raises(ValidationError, match="needs a table with a primary key"):
        t.upsert(rows([1]))
    with pytest.raises(ValidationError, match="needs a table with a primary key"):
        t.compact()
    assert t.current_snapshot_id is None


def test_pandas_and_batches_see_merged_rows(users):
    users.upsert(rows([1, 2], "a"))
    users.upsert(rows([2], "b"))
    df = users.to_pandas().sort_values("id")
    assert df["email"].tolist() == ["a1", "b2"]
    batches = list(users.scan(columns=["email"]).to_batches())
    assert sorted(v for b in batches for v in b["email"].to_pylist()) == ["a1", "b2"]


# -- reading without merging, partition columns from metadata ----------------------------------


def test_buckets_of_disjoint_runs_are_read_without_merging(lake, monkeypatch):
    from arrowlake.merge import read as merge_read

    table = lake.create_table("crm.ranges", pa.schema([("id", pa.int64()), ("v", pa.string())]),
                              deletion_vectors=False, primary_key=["id"], buckets=1,
                              properties={"compaction.max-runs": "50"})
    table.upsert(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    table.upsert(pa.table({"id": [10, 11], "v": ["x", "y"]}))  # keys above the first run's
    merged: list[int] = []
    real = merge_read.merge_rows
    monkeypatch.setattr(merge_read, "merge_rows",
                        lambda spec, rows, keep=False: merged.append(rows.num_rows) or
                        real(spec, rows, keep))
    got = table.scan(filter="v <> 'b'").to_arrow().sort_by("id")
    assert got.column("id").to_pylist() == [1, 3, 10, 11]
    assert merged == []  # two runs, additions only, disjoint key ranges
    table.upsert(pa.table({"id": [2], "v": ["B"]}))  # overlaps the first run
    got = table.scan().to_arrow().sort_by("id")
    assert got.column("v").to_pylist() == ["a", "B", "c", "x", "y"]
    assert merged == [6]
    table.delete("id = 11")  # a tombstone run must be merged
    merged.clear()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 10]
    assert merged == [7]
    table.compact(full=True)
    merged.clear()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 10]
    assert merged == []


def test_partition_columns_come_from_metadata_not_from_files(lake):
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("region", pa.string()),
                        ("v", pa.float64())])
    import datetime as dt

    for primary_key in (["id", "day", "region"], None):
        name = f"crm.parts_{'pk' if primary_key else 'plain'}"
        table = lake.create_table(name, schema, partition_by=["day", "region"],
                                  **({"primary_key": primary_key, "buckets": 2}
                                     if primary_key else {}))
        days = [dt.date(2026, 11, 1 + i % 3) for i in range(30)]
        regions = ["eu", "us", "eu"] * 10
        data = pa.table({"id": list(range(30)), "day": days, "region": regions,
                         "v": [float(i) for i in range(30)]}, schema=schema)
        if primary_key:
            table.upsert(data)
            table.upsert(data.slice(0, 10))  # a second, overlapping run: merged reads
        else:
            table.append(data)
        expected = data.sort_by("id")
        assert table.to_arrow().sort_by("id").equals(expected.cast(table.schema))
        got = table.scan(columns=["region", "id"], filter="v >= 20").to_arrow().sort_by("id")
        assert got.column("region").to_pylist() == regions[20:]
        assert got.schema.field("region").type == pa.string()
        # A filter on a partition column is pushed into the scan, which then reads it.
        got = table.scan(columns=["day"], filter="region = 'us'").to_arrow()
        assert sorted(got.column("day").to_pylist()) == sorted(days[1::3])


@pytest.mark.parametrize("value", [
    pa.scalar("eu"), pa.scalar("", pa.string()), pa.scalar("ü", pa.large_string()),
    pa.scalar(b"\x00\x01", pa.binary()), pa.scalar(-7, pa.int8()), pa.scalar(2**40),
    pa.scalar(1.5, pa.float32()), pa.scalar(True), pa.scalar(None, pa.string()),
    pa.scalar(19000, pa.date32()), pa.scalar(5, pa.timestamp("us", tz="Europe/Paris")),
    pa.scalar(12, pa.decimal128(5, 2)),
])
def test_constant_array_repeats_any_value(value):
    from arrowlake.scan.read import constant_array

    for length in (0, 1, 1000):
        got = constant_array(value, length)
        got.validate(full=True)
        assert got.type == value.type
        assert got.equals(pa.array([value.as_py()] * length, value.type))


@pytest.mark.parametrize("engine,options", [
    ("partial-update", {}),
    ("aggregation", {"aggregations": {"clicks": "sum"},
                     "properties": {"aggregation.remove-record-on-delete": "true",
                                    "compaction.max-runs": "50"}}),
])
def test_compacting_newer_runs_alone_keeps_resets(lake, engine, options):
    """A size-tiered compaction of the newer runs leaves the big oldest run alone; a reset in
    the newer runs (a retraction followed by additions) must still hide the oldest values."""
    options = dict(options)  # parametrized values are shared between the lakes
    # A generous size ratio: the two small newer runs differ in size, but merge.
    properties = {"compaction.max-runs": "50", "compaction.size-ratio": "2",
                  **options.pop("properties", {})}
    table = lake.create_table(f"crm.tiered_{engine.replace('-', '_')}", SCHEMA,
                              primary_key=["id"], buckets=1, merge_engine=engine,
                              deletion_vectors=False,
                              properties=properties, **options)
    table.upsert(rows(range(20_000), email="old", clicks=5, ts=1))  # the big, oldest run
    changes = pa.table({"id": [1, 1, 2], "email": ["old1", None, None],
                        "clicks": [5, 7, None], "ts": [1, None, 9], "op": ["-D", "+I", "+U"]},
                       schema=SCHEMA.append(pa.field("op", pa.string())))
    table.write_changes(changes, row_kind="op")
    table.upsert(pa.table({"id": [3], "email": [None], "clicks": [1], "ts": [None]},
                          schema=SCHEMA))
    before = current(table)
    oldest = min(table.files().to_pylist(), key=lambda f: f["file_id"])["file_id"]
    result = table.compact()
    assert result.snapshot_id is not None and result.removed_files == 2
    assert oldest in table.files().column("file_id").to_pylist()  # left alone
    assert current(table) == before
    # Key 1 was deleted, then re-added with only clicks: nothing of the old row shows.
    assert before[1]["email"] is None and before[1]["clicks"] == 7
    assert before[2]["email"] == "old2"
    table.compact(full=True)
    assert current(table) == before


# -- found in review: partition values that statistics cannot hold, keys of partition columns ---


@pytest.fixture
def s3_lake(request, tmp_path):
    from tests.conftest import make_lake

    lake = make_lake("sqlite-s3", tmp_path, request)
    yield lake
    lake.close()


def test_long_partition_values_are_kept_whole(s3_lake):
    """Partition strings over 256 characters (too long for statistics, and for a directory name
    on local disk, so S3 here) are stored whole: each value gets its own files, reads and
    rewrites keep them, and filters on them find them."""
    a, b = "a" * 300, "b" * 300
    plain = s3_lake.create_table("ns.plain", pa.schema([("p", pa.string()), ("v", pa.int64())]),
                                 partition_by=["p"])
    plain.append(pa.table({"p": [a, b, None], "v": [1, 2, 3]}))
    assert plain.files().num_rows == 3
    assert plain.to_arrow().sort_by("v").column("p").to_pylist() == [a, b, None]
    assert plain.scan(filter=al.col("p") == b).to_arrow().column("v").to_pylist() == [2]
    plain.delete("v = 1")
    assert plain.to_arrow().sort_by("v").column("p").to_pylist() == [b, None]
    keyed = s3_lake.create_table(
        "ns.keyed", pa.schema([("p", pa.string()), ("id", pa.int64()), ("v", pa.int64())]),
        primary_key=["p", "id"], partition_by=["p"], buckets=1)
    keyed.upsert(pa.table({"p": [a, b], "id": [1, 1], "v": [1, 2]}))
    keyed.upsert(pa.table({"p": [a], "id": [1], "v": [10]}))
    expected = [(a, 1, 10), (b, 1, 2)]
    assert sorted((r["p"], r["id"], r["v"]) for r in keyed.to_arrow().to_pylist()) == expected
    keyed.compact(full=True)
    assert sorted((r["p"], r["id"], r["v"]) for r in keyed.to_arrow().to_pylist()) == expected
    assert keyed.scan(filter=al.col("p") == a).to_arrow().column("v").to_pylist() == [10]


def test_key_of_partition_columns_only_with_a_filter_on_one(lake):
    schema = pa.schema([("p1", pa.int64()), ("p2", pa.string()), ("v", pa.int64())])
    table = lake.create_table("ns.parts_key", schema, primary_key=["p1", "p2"],
                              partition_by=["p1", "p2"], buckets=1)
    table.upsert(pa.table({"p1": [1, 1, 2], "p2": ["a", "b", "a"], "v": [1, 2, 3]},
                          schema=schema))
    table.upsert(pa.table({"p1": [1], "p2": ["a"], "v": [10]}, schema=schema))  # a merge
    got = table.scan(filter="p1 = 1").to_arrow().to_pylist()
    assert sorted(got, key=repr) == [{"p1": 1, "p2": "a", "v": 10}, {"p1": 1, "p2": "b", "v": 2}]
    assert table.scan(filter="p1 = 1").count() == 2


def test_constant_column_splits_what_one_array_cannot_address():
    from arrowlake.scan import read

    value = pa.scalar("x" * 1000)
    with pytest.raises(ValueError, match="2 GiB"):
        read.constant_array(value, 3_000_000)
    # A smaller chunk limit shows the chunking without allocating gigabytes.
    limit, read._MAX_CHUNK_BYTES = read._MAX_CHUNK_BYTES, 10_000
    try:
        column = read.constant_column(value, 25)
    finally:
        read._MAX_CHUNK_BYTES = limit
    assert [len(c) for c in column.chunks] == [10, 10, 5]
    assert column.to_pylist() == ["x" * 1000] * 25


def test_view_typed_schemas_and_polars_data(lake):
    """Polars produces string_view/binary_view: a table created from such a schema stores plain
    strings (Parquet has no views; Arrow's take and filter lack view kernels), and view-typed
    data upserts, merges, deletes and reads."""
    import polars as pl

    newest = pl.CompatLevel.newest()  # Polars' own layout: views
    frame = pl.DataFrame({"k": ["x", "y", "z"], "v": [1, 2, 3], "tags": [["a"], [], None]})
    data = frame.to_arrow(compat_level=newest)
    assert data.schema.field("k").type == pa.string_view()
    table = lake.create_table("crm.views", data.schema, primary_key=["k"], buckets=2)
    assert table.schema.field("k").type == pa.string()
    assert table.schema.field("tags").type.value_type == pa.string()
    table.upsert(data)
    table.upsert(pl.DataFrame({"k": ["x"], "v": [10], "tags": [["b"]]}).to_arrow(
        compat_level=newest))
    table.delete("k = 'y'")
    got = sorted(table.to_arrow().to_pylist(), key=lambda r: r["k"])
    assert got == [{"k": "x", "v": 10, "tags": ["b"]}, {"k": "z", "v": 3, "tags": None}]
    assert table.scan(filter="v > 5", columns=["k"]).to_arrow().column("k").to_pylist() == ["x"]


@pytest.mark.parametrize("engine,options", [
    ("deduplicate", {}), ("partial-update", {}), ("first-row", {}),
    ("aggregation", {"aggregations": {"clicks": "sum"}}),
])
def test_small_buckets_merged_together_read_as_merged_alone(sqlite_lake, monkeypatch, engine,
                                                            options):
    """Small buckets share one merge call; the same ids in two partitions stay apart, and
    every engine gives what merging each bucket alone gives."""
    from arrowlake.merge import read as merge_read

    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("email", pa.string()),
                        ("clicks", pa.int64())])
    table = sqlite_lake.create_table(
        "crm.parts", schema, primary_key=["region", "id"], partition_by=["region"], buckets=3,
        deletion_vectors=False,
        merge_engine=engine, properties={"compaction.max-runs": "50"}, **options)

    def batch(region, ids, email, clicks):
        n = len(ids)
        return pa.table({"region": [region] * n, "id": pa.array(ids, pa.int64()),
                         "email": [None if email is None else f"{email}{i}" for i in ids],
                         "clicks": pa.array([clicks] * n, pa.int64())}, schema=schema)

    for region in ("eu", "us"):  # the same ids in both partitions
        table.upsert(batch(region, list(range(20)), "a", 1))
        table.upsert(batch(region, list(range(5, 25)), None if engine == "partial-update"
                           else "b", 2))
    if engine == "aggregation":  # delete() is refused there; a -D as change data subtracts
        gone = table.scan(filter="region = 'us' and id < 3").to_arrow()
        table.write_changes(gone.append_column("op", pa.array(["-D"] * gone.num_rows)),
                            row_kind="op")
    elif engine != "first-row":
        table.delete("region = 'us' and id < 3")

    calls: list[int] = []
    real = merge_read.merge_together
    monkeypatch.setattr(merge_read, "merge_together",
                        lambda spec, buckets: calls.append(len(buckets)) or real(spec, buckets))
    together = table.to_arrow().sort_by([("region", "ascending"), ("id", "ascending")])
    filtered = table.scan(filter="id >= 4 and clicks > 1", columns=["id", "clicks", "region"]
                          ).to_arrow().sort_by([("region", "ascending"), ("id", "ascending")])
    assert calls and max(calls) > 1  # buckets were merged together
    monkeypatch.setattr(merge_read, "SMALL_BUCKET_ROWS", 0)
    calls.clear()
    alone = table.to_arrow().sort_by([("region", "ascending"), ("id", "ascending")])
    assert calls == []
    assert together.equals(alone)
    assert filtered.equals(table.scan(filter="id >= 4 and clicks > 1",
                                      columns=["id", "clicks", "region"]).to_arrow()
                           .sort_by([("region", "ascending"), ("id", "ascending")]))
    # A delete removes keys, except in first-row (none written) and aggregation (subtracts).
    removed = 3 if engine in ("deduplicate", "partial-update") else 0
    assert together.num_rows == 25 + 25 - removed
