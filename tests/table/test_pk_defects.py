"""Regression tests for the primary-key items of the defects issue (2, 8, 9, 10, 11, 13)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import ColumnNotFound, CommitConflict, SchemaMismatch, ValidationError
from arrowlake.table.maintenance import after_write
from arrowlake.table.writes import keyed as pk
from arrowlake.table.writes import merge_into
from tests.conftest import METASTORES, make_lake

I64 = pa.int64()


@pytest.fixture(params=METASTORES)
def mlake(request, tmp_path):
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


def rows_by_id(table: al.Table) -> dict:
    return {r["id"]: r for r in table.to_arrow().to_pylist()}


def race_after_reads(monkeypatch, module, table: al.Table, write, times: int = 1) -> list[int]:
    """Run ``write(other handle)`` right after each of the first ``times`` reads of a delete or
    merge (between its read and its commit), as a concurrent writer would."""
    real = module.scan_at
    calls: list[int] = []

    def racing(t, base, expr):
        out = real(t, base, expr)
        calls.append(base)
        if len(calls) <= times:
            write(al.Table(table._lake, table._record))
        return out

    monkeypatch.setattr(module, "scan_at", racing)
    return calls


# -- item 2: deletes and merges re-check the keys they read ----------------------------------------


def test_item2_pk_delete_rechecks_keys(mlake, monkeypatch):
    t = mlake.create_table("d.u", pa.schema([("id", I64), ("amount", I64)]),
                           deletion_vectors=False, primary_key=["id"])
    t.upsert({"id": [1, 2], "amount": [-5, 7]})
    calls = race_after_reads(monkeypatch, pk, t,
                             lambda other: other.upsert({"id": [1], "amount": [100]}))
    result = t.delete("amount < 0")
    # Re-planned on the upsert's snapshot, where id 1 no longer matches: nothing is deleted.
    assert len(calls) == 2 and result.snapshot_id is None
    assert rows_by_id(t) == {1: {"id": 1, "amount": 100}, 2: {"id": 2, "amount": 7}}
    assert t.snapshots()["kind"].to_pylist() == ["upsert", "upsert"]


def test_item2_pk_delete_ignores_commits_to_other_keys(mlake, monkeypatch):
    t = mlake.create_table("d.u", pa.schema([("id", I64), ("amount", I64)]),
                           primary_key=["id"], buckets=1)
    t.upsert({"id": [1, 2], "amount": [-5, 7]})
    calls = race_after_reads(monkeypatch, pk, t,
                             lambda other: other.upsert({"id": [500], "amount": [8]}))
    t.delete("amount < 0")
    # The concurrent run holds only key 500, outside the keys deleted, and no row matching
    # the filter: no re-plan needed.
    assert len(calls) == 1
    assert rows_by_id(t) == {2: {"id": 2, "amount": 7}, 500: {"id": 500, "amount": 8}}


def test_item2_pk_delete_replans_for_keys_that_match_only_since_its_read(mlake, monkeypatch):
    t = mlake.create_table("d.u", pa.schema([("id", I64), ("amount", I64)]),
                           primary_key=["id"], buckets=1)
    t.upsert({"id": [1, 2], "amount": [-5, 7]})
    calls = race_after_reads(monkeypatch, pk, t,
                             lambda other: other.upsert({"id": [2, 500], "amount": [-1, -2]}))
    result = t.delete("amount < 0")
    # Serially the delete comes after the upsert: every key matching then is deleted.
    assert len(calls) == 2 and result.removed_rows == 3
    assert t.to_arrow().num_rows == 0


def test_item2_pk_merge_rechecks_keys(mlake, monkeypatch):
    schema = pa.schema([("id", I64), ("v", pa.string()), ("ts", I64)])
    t = mlake.create_table("d.m", schema, primary_key=["id"])
    t.upsert({"id": [1], "v": ["old"], "ts": [5]})
    calls = race_after_reads(monkeypatch, merge_into, t,
                             lambda other: other.upsert({"id": [1, 2], "v": ["newer", "x"],
                                                         "ts": [9, 1]}))
    result = (t.merge(pa.table({"id": [1, 2], "v": ["src", "src"], "ts": [7, 7]}), on="id")
              .when_matched_update(where="source.ts > target.ts")
              .when_not_matched_insert().execute())
    assert len(calls) == 2
    # On the newer snapshot id 1 (ts 9) is newer than the source and id 2 exists (ts 1 < 7).
    assert (result.inserted, result.updated, result.unchanged) == (0, 1, 1)
    assert rows_by_id(t) == {1: {"id": 1, "v": "newer", "ts": 9},
                             2: {"id": 2, "v": "src", "ts": 7}}


def test_item2_pk_merge_rechecks_after_an_overwrite_that_only_removes(mlake, monkeypatch):
    schema = pa.schema([("p", I64), ("id", I64), ("ts", I64)])
    t = mlake.create_table("d.o", schema, primary_key=["p", "id"], partition_by=["p"])
    t.upsert({"p": [1], "id": [1], "ts": [5]})
    race_after_reads(monkeypatch, merge_into, t,
                     lambda other: other.overwrite(schema.empty_table(), "p = 1"))
    result = (t.merge(pa.table({"p": [1], "id": [1], "ts": [7]}), on=["p", "id"])
              .when_matched_update(where="source.ts > target.ts").execute())
    # After the overwrite nothing matches: the key must not come back as an update.
    assert result.snapshot_id is None and result.unchanged == 1
    assert t.to_arrow().num_rows == 0


def test_item2_pk_delete_gives_up_with_commit_conflict_leaving_table_unchanged(
        mlake, monkeypatch):
    t = mlake.create_table("d.u", pa.schema([("id", I64), ("amount", I64)]),
                           primary_key=["id"], properties={"compaction.max-runs": "50"},
                           deletion_vectors=False)
    t.upsert({"id": [1], "amount": [-5]})
    bump = iter(range(-100, 0))
    race_after_reads(monkeypatch, pk, t,
                     lambda other: other.upsert({"id": [1], "amount": [next(bump)]}),
                     times=pk.REPLAN_ATTEMPTS)
    with pytest.raises(CommitConflict, match="planned 5 times"):
        t.delete("amount < 0")
    assert t.snapshots()["kind"].to_pylist() == ["upsert"] * (1 + pk.REPLAN_ATTEMPTS)
    assert rows_by_id(t) == {1: {"id": 1, "amount": -96}}
    # No file of the failed attempts is left behind.
    assert len({f.path for f in t._storage.list_files(t.location)}) == t.files().num_rows


# -- item 8: merge options and buckets are fixed -------------------------------------------------


def test_item8_engine_options_cannot_change_after_creation(sqlite_lake):
    t = sqlite_lake.create_table("p.u", pa.schema([("id", I64)]), primary_key=["id"])
    t.upsert({"id": [1]})
    t.delete("id = 1")
    before = dict(t._record.properties)
    for change in ({"ignore-delete": "true"}, {"merge-engine": "first-row"},
                   {"aggregation.remove-record-on-delete": "true"},
                   {"fields.id.aggregate-function": "max"}):
        with pytest.raises(ValidationError, match="cannot be changed after creation"):
            t.set_properties(**change)
    with pytest.raises(ValidationError, match="'buckets' is not a property"):
        t.set_properties(buckets="8")
    assert t._record.properties == before
    assert t.to_arrow().num_rows == 0  # the deleted key stays deleted
    t.set_properties(**{"merge-engine": "deduplicate", "compaction.max-runs": "7"})  # no change
    assert t._record.properties["compaction.max-runs"] == "7"


# -- item 9: what delete() means for each engine ---------------------------------------------------


@pytest.mark.parametrize("options,properties", [
    ({"merge_engine": "first-row"}, {}),
    ({"merge_engine": "aggregation", "aggregations": {"v": "sum"}}, {}),
    ({}, {"ignore-delete": "true"}),
    ({"merge_engine": "partial-update"}, {"partial-update.ignore-delete": "true"}),
])
def test_item9_delete_is_refused_where_the_engine_keeps_the_key(sqlite_lake, options,
                                                                  properties):
    t = sqlite_lake.create_table("p.f", pa.schema([("id", I64), ("v", I64)]),
                                 primary_key=["id"], properties=properties, **options)
    t.upsert({"id": [1], "v": [5]})
    with pytest.raises(ValidationError, match="cannot delete rows"):
        t.delete("id = 1")
    with pytest.raises(ValidationError, match="cannot delete rows"):
        t.merge(pa.table({"id": [1]}), on="id").when_matched_delete()
    assert t.to_arrow().to_pylist() == [{"id": 1, "v": 5}]
    assert t.snapshots().num_rows == 1


def test_item9_delete_removes_the_key_where_the_engine_allows(sqlite_lake):
    schema = pa.schema([("id", I64), ("v", I64)])
    agg = sqlite_lake.create_table(
        "p.a", schema, primary_key=["id"], merge_engine="aggregation",
        aggregations={"v": "sum"}, properties={"aggregation.remove-record-on-delete": "true"})
    dedup = sqlite_lake.create_table("p.d", schema, primary_key=["id"])
    partial = sqlite_lake.create_table("p.p", schema, primary_key=["id"],
                                       merge_engine="partial-update")
    for t in (agg, dedup, partial):
        t.upsert({"id": [1, 2], "v": [5, 6]})
        result = t.delete("id = 1")
        assert result.removed_rows == 1
        assert t.to_arrow().to_pylist() == [{"id": 2, "v": 6}]
        t.upsert({"id": [1], "v": [3]})  # the key comes back, with nothing of before
        assert rows_by_id(t)[1] == {"id": 1, "v": 3}


# -- item 10: NaN and null sequence values ---------------------------------------------------------


def test_item10_nan_sequence_value_is_refused_and_null_orders_oldest(sqlite_lake):
    t = sqlite_lake.create_table("p.s", pa.schema([("id", I64), ("v", I64),
                                                   ("ts", pa.float64())]),
                                 primary_key=["id"], sequence_field="ts")
    t.upsert({"id": [1], "v": [1], "ts": [1.0]})
    with pytest.raises(ValidationError, match="NaN in sequence_field 'ts'"):
        t.upsert({"id": [1], "v": [0], "ts": [float("nan")]})
    with pytest.raises(ValidationError, match="NaN"):
        t.write_changes(pa.table({"id": [1], "v": [0], "ts": [float("nan")], "op": ["+U"]}))
    assert t.snapshots().num_rows == 1
    t.upsert({"id": [1], "v": [2], "ts": [0.5]})  # older value: hidden
    t.upsert({"id": [1], "v": [3], "ts": [None]})  # null is older than any value: hidden
    assert t.to_arrow().to_pylist() == [{"id": 1, "v": 1, "ts": 1.0}]
    t.upsert({"id": [2], "v": [7], "ts": [None]})
    t.upsert({"id": [2], "v": [8], "ts": [None]})  # equal (null) values: the later commit wins
    assert rows_by_id(t)[2]["v"] == 8


# -- item 11: schema changes of primary-key tables ----------------------------------------------


def test_item11_renames_carry_engine_options(sqlite_lake):
    s = sqlite_lake.create_table("p.s", pa.schema([("id", I64), ("ts", I64)]),
                                 primary_key=["id"], sequence_field="ts")
    a = sqlite_lake.create_table("p.a", pa.schema([("id", I64), ("n", I64)]),
                                 primary_key=["id"], merge_engine="aggregation",
                                 aggregations={"n": "sum"})
    s.upsert({"id": [1], "ts": [5]})
    s.upsert({"id": [1], "ts": [3]})
    a.upsert({"id": [1], "n": [2]})
    a.upsert({"id": [1], "n": [3]})
    # (With deletion vectors an upsert of an older version of a key commits no snapshot.)
    s_before, a_before = s.current_snapshot_id, a.current_snapshot_id
    s.rename_column("ts", "ts2")
    a.rename_column("n", "m")
    assert s.to_arrow().to_pylist() == [{"id": 1, "ts2": 5}]
    assert a.to_arrow().to_pylist() == [{"id": 1, "m": 5}]
    s.upsert({"id": [1], "ts2": [4]})  # still ordered by the renamed sequence field
    a.upsert({"id": [1], "m": [10]})  # still summed
    assert s.to_arrow().to_pylist() == [{"id": 1, "ts2": 5}]
    assert a.to_arrow().to_pylist() == [{"id": 1, "m": 15}]
    s.upsert({"id": [2], "ts2": [1]})  # a snapshot after the rename, in either mode
    # Time travel to before the rename reads under the old names.
    assert s.scan(snapshot=s_before).to_arrow().to_pylist() == [{"id": 1, "ts": 5}]
    assert a.scan(snapshot=a_before).to_arrow().to_pylist() == [{"id": 1, "n": 5}]
    a.compact(full=True)
    assert a.to_arrow().to_pylist() == [{"id": 1, "m": 15}]


def test_item11_drops_of_engine_columns_and_reserved_names_are_refused(sqlite_lake):
    s = sqlite_lake.create_table("p.s", pa.schema([("id", I64), ("ts", I64), ("x", I64)]),
                                 primary_key=["id"], sequence_field="ts")
    a = sqlite_lake.create_table("p.a", pa.schema([("id", I64), ("n", I64)]),
                                 primary_key=["id"], merge_engine="aggregation",
                                 aggregations={"n": "sum"}, default_aggregation="sum")
    s.upsert({"id": [1], "ts": [1], "x": [1]})
    with pytest.raises(SchemaMismatch, match="merge engine .* uses it"):
        s.drop_column("ts")
    with pytest.raises(SchemaMismatch, match="merge engine .* uses it"):
        a.drop_column("n")
    for name in ("_seq", "_row_kind"):
        with pytest.raises(SchemaMismatch, match="reserved"):
            s.add_column(name, I64)
        with pytest.raises(SchemaMismatch, match="reserved"):
            s.rename_column("x", name)
    with pytest.raises(ValidationError, match="sum"):
        a.add_column("label", pa.string())  # the default function cannot sum strings
    s.drop_column("x")  # a column the engine does not use can go
    assert s.to_arrow().to_pylist() == [{"id": 1, "ts": 1}]
    assert [f.name for f in a.schema] == ["id", "n"]


# -- item 13: properties, failures after commit, merge sources -------------------------------------


@pytest.mark.parametrize("name,value", [("compaction.max-runs", "five"),
                                        ("compaction.max-runs", "0"),
                                        ("compaction.size-ratio", "0"),
                                        ("compaction.size-ratio", "inf"),
                                        ("compaction.size-ratio", "abc"),
                                        ("ignore-delete", "yes"),
                                        ("merge-engine", "newest")])
def test_item13_malformed_properties_are_refused_when_set(sqlite_lake, name, value):
    schema = pa.schema([("id", I64)])
    with pytest.raises(ValidationError, match=f"'{name}'"):
        sqlite_lake.create_table("p.c", schema, primary_key=["id"],
                                 properties={name: value})
    assert not sqlite_lake.table_exists("p.c")
    t = sqlite_lake.create_table("p.c", schema, primary_key=["id"])
    before = dict(t._record.properties)
    if name not in ("ignore-delete", "merge-engine"):  # fixed ones are refused as changes
        with pytest.raises(ValidationError, match=f"'{name}'"):
            t.set_properties(**{name: value})
    assert t._record.properties == before
    assert t.upsert({"id": [1]}).snapshot_id == 1


def test_item13_a_failing_compaction_never_fails_a_landed_write(sqlite_lake, monkeypatch):
    t = sqlite_lake.create_table("p.c", pa.schema([("id", I64)]), primary_key=["id"],
                                 properties={"compaction.max-runs": "1"})
    t.upsert({"id": [1]})

    def broken(table, touched):
        raise OSError("disk full while compacting")

    monkeypatch.setattr(after_write, "compact_if_needed", broken)
    result = t.upsert({"id": [2]})
    assert result.snapshot_id == 2
    assert sorted(t.to_arrow()["id"].to_pylist()) == [1, 2]


def test_item13_merge_source_key_types_are_cast_safely(sqlite_lake):
    t = sqlite_lake.create_table("p.m", pa.schema([("id", I64), ("v", pa.int32())]),
                                 primary_key=["id"])
    t.upsert({"id": [1], "v": [1]})
    source = pa.table({"id": pa.array([1, 2], pa.int32()), "v": pa.array([5, 6], I64)})
    result = (t.merge(source, on="id").when_matched_update().when_not_matched_insert()
              .execute())
    assert (result.inserted, result.updated) == (1, 1)
    assert rows_by_id(t) == {1: {"id": 1, "v": 5}, 2: {"id": 2, "v": 6}}
    too_big = pa.table({"id": pa.array([3], I64), "v": pa.array([2**40], I64)})
    with pytest.raises(SchemaMismatch, match="'v'"):
        t.merge(too_big, on="id")


def test_item13_merge_refuses_unknown_columns_in_set_and_values(sqlite_lake):
    t = sqlite_lake.create_table("p.m", pa.schema([("id", I64), ("v", I64)]),
                                 primary_key=["id"])
    builder = t.merge(pa.table({"id": [1], "v": [2]}), on="id")
    with pytest.raises(ColumnNotFound, match="nope"):
        builder.when_matched_update(set={"nope": "source.v"})
    with pytest.raises(ColumnNotFound, match="nope"):
        builder.when_not_matched_insert(values={"id": "source.id", "nope": 1})
