"""Item 1 of the defects issue: ids are never reused, and a handle to a dropped table writes
nowhere (TableNotFound), in this process or another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import TableNotFound
from tests.conftest import METASTORES, make_lake

I64 = pa.int64()


def _other(lake: al.Lake) -> al.Lake:
    """A second connection to the same lake: stands in for another process."""
    return al.connect(lake.metastore.url, warehouse=lake.warehouse)


@pytest.mark.parametrize("kind", METASTORES)
def test_item1_racing_delete_does_not_remove_a_new_file_with_a_freed_id(kind, tmp_path,
                                                                        request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", I64)]))
    t.append({"id": [1, 2, 3]})
    other = _other(lake)
    real = lake.metastore.commit
    done: list[int] = []

    def racing(table_id, base, change):  # another writer between the plan and the commit
        if change.kind == "delete" and not done:
            done.append(1)
            o = other.table("t")
            o.delete("id >= 1")
            o.expire_snapshots()
            o.append({"id": [100]})
        return real(table_id, base, change)

    lake.metastore.commit = racing  # type: ignore[method-assign]
    t.delete("id = 2")  # re-planned on the new snapshot: nothing left to delete
    assert done
    assert t.to_arrow().column("id").to_pylist() == [100]
    other.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item1_file_and_table_ids_grow_past_deleted_rows(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", I64)]))
    t.append({"id": [1]})
    t.append({"id": [2]})
    first_ids = t.files().column("file_id").to_pylist()
    t.delete("id >= 1")
    t.expire_snapshots()  # deletes the rows of both files
    t.append({"id": [3]})
    (new_id,) = t.files().column("file_id").to_pylist()
    assert new_id > max(first_ids)

    old_table_id = t._record.table_id
    lake.drop_table("t")
    again = lake.create_table("t", pa.schema([("id", I64)]))
    assert again._record.table_id > old_table_id
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item1_stale_handle_from_another_process_cannot_write_into_a_new_table(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    a = lake.create_table("a", pa.schema([("id", I64)]))
    a.append({"id": [1]})
    other = _other(lake)
    other.drop_table("a")
    other.create_table("b", pa.schema([("id", I64), ("s", pa.string())]))
    other.create_table("a", pa.schema([("id", I64)]))  # the old name, a new table

    with pytest.raises(TableNotFound, match="dropped"):
        a.append({"id": [99]})
    with pytest.raises(TableNotFound):
        a.overwrite({"id": [99]})
    with pytest.raises(TableNotFound):
        a.delete("id = 1")
    with pytest.raises(TableNotFound):
        a.add_column("x", pa.string())
    with pytest.raises(TableNotFound):
        a.set_properties(**{"write.row-group-rows": "100"})
    with pytest.raises(TableNotFound):
        a.create_tag("v1", snapshot=1)
    with pytest.raises(TableNotFound):
        a.drop_tag("v1")
    with pytest.raises(TableNotFound):
        a.expire_snapshots()
    with pytest.raises(TableNotFound):
        a.to_arrow()
    for name in ("a", "b"):
        fresh = other.table(name)
        assert fresh.to_arrow().num_rows == 0
        assert fresh.snapshots().num_rows == 0
        assert fresh.tags() == {}
        assert "x" not in fresh.schema.names
    other.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item1_stale_primary_key_handle_cannot_upsert_or_compact(kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    schema = pa.schema([pa.field("k", I64, nullable=False), ("v", I64)])
    a = lake.create_table("a", schema, primary_key=["k"], buckets=1)
    a.upsert({"k": [1], "v": [1]})
    a.upsert({"k": [1], "v": [2]})
    other = _other(lake)
    other.drop_table("a")
    other.create_table("a", schema, primary_key=["k"], buckets=1)
    with pytest.raises(TableNotFound):
        a.upsert({"k": [2], "v": [2]})
    with pytest.raises(TableNotFound):
        a.compact(full=True)
    assert other.table("a").to_arrow().num_rows == 0
    other.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item1_same_process_new_table_does_not_take_a_dropped_tables_schema(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    a = lake.create_table("a", pa.schema([("id", I64)]))
    assert a.schema.names == ["id"]  # cached by the metastore
    lake.drop_table("a")
    b = lake.create_table("b", pa.schema([("id", I64), ("s", pa.string())]))
    b.append({"id": [1], "s": ["x"]})
    assert lake.table("b").schema.names == ["id", "s"]
    assert lake.table("b").to_arrow().to_pylist() == [{"id": 1, "s": "x"}]
    with pytest.raises(TableNotFound):
        a.append({"id": [2]})
    lake.close()


def _aggregating(lake: al.Lake) -> al.Table:
    return lake.create_table("agg", pa.schema([("id", I64), ("v", I64)]), primary_key=["id"],
                             buckets=1, merge_engine="aggregation", aggregations={"v": "sum"})


def _before_first_call(lake: al.Lake, method: str, action: Callable[[], object]) -> list[int]:
    """Patches ``lake.metastore.<method>`` so that its first call runs ``action`` (another
    writer committing in between) before doing its work; returns the record of its calls."""
    real = getattr(lake.metastore, method)
    calls: list[int] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            action()
        calls.append(1)
        return real(*args, **kwargs)

    setattr(lake.metastore, method, racing)
    return calls


@pytest.mark.parametrize("kind", METASTORES)
def test_set_properties_keeps_a_rename_committed_meanwhile(kind, tmp_path, request):
    """set_properties merges its change into the properties as they are under the table's
    row lock: a rename committed between its read and its write keeps the options it moved
    (``fields.v.*`` -> ``fields.w.*``)."""
    lake = make_lake(kind, tmp_path, request)
    t = _aggregating(lake)
    other = _other(lake)
    calls = _before_first_call(lake, "update_properties",
                               lambda: other.table("agg").rename_column("v", "w"))
    t.set_properties(**{"compaction.max-runs": "7"})
    assert calls == [1]
    props = other.table("agg").properties
    assert props["compaction.max-runs"] == "7"
    assert props["fields.w.aggregate-function"] == "sum"
    assert "fields.v.aggregate-function" not in props
    t.upsert({"id": [1, 1], "w": [2, 3]})
    assert t.to_arrow().to_pydict() == {"id": [1], "w": [5]}


@pytest.mark.parametrize("kind", METASTORES)
def test_a_rename_does_not_overwrite_properties_set_meanwhile(kind, tmp_path, request):
    """A rename rewrites the merge options it derived from the properties it read; if another
    writer set a property in between, the rename is a CommitConflict (nothing changed), and
    done again it keeps both."""
    lake = make_lake(kind, tmp_path, request)
    t = _aggregating(lake)
    other = _other(lake)
    _before_first_call(lake, "add_schema",
                       lambda: other.table("agg").set_properties(**{"compaction.max-runs": "9"}))
    with pytest.raises(al.CommitConflict):
        t.rename_column("v", "w")
    fresh = other.table("agg")
    assert fresh.schema.names == ["id", "v"]
    assert fresh.properties["compaction.max-runs"] == "9"
    t.rename_column("v", "w")
    props = other.table("agg").properties
    assert props["compaction.max-runs"] == "9"
    assert props["fields.w.aggregate-function"] == "sum"
