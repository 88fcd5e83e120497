"""Table locations: refused where a table's files would mix with another's or the metastore's,
and orphan removal / purge that never touch what is not the table's own (issue item 12)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import ValidationError
from arrowlake.schema import assign_field_ids
from tests.conftest import put_file, stored_paths

SCHEMA = pa.schema([("id", pa.int64())])


def legacy_table(lake: al.Lake, name: str, location: str) -> al.Table:
    """A table whose location an older version accepted without checking it: recorded in the
    metastore as that version did."""
    ns, tbl = name.split(".")
    schema, next_id = assign_field_ids(SCHEMA)
    lake.metastore.create_table(ns, tbl, location=location, schema=schema,
                                last_field_id=next_id - 1)
    return lake.table(name)


def test_item12_location_at_or_above_warehouse_root_refused(lake: al.Lake) -> None:
    with pytest.raises(ValidationError, match="warehouse root"):
        lake.create_table("b", SCHEMA, location=lake.warehouse)
    parent = lake.warehouse.rsplit("/", 1)[0]
    with pytest.raises(ValidationError, match="contains the warehouse root"):
        lake.create_table("b", SCHEMA, location=parent)
    assert lake.tables() == []


def test_item12_location_of_another_table_refused(lake: al.Lake) -> None:
    a = lake.create_table("a", SCHEMA)
    a.append({"id": [1]})
    with pytest.raises(ValidationError, match="'default.a'") as same:
        lake.create_table("c", SCHEMA, location=a.location)
    assert "is the location of" in str(same.value)
    with pytest.raises(ValidationError, match="is inside the location of table 'default.a'"):
        lake.create_table("c", SCHEMA, location=a.location + "/data/sub")
    outer = lake.warehouse + "/outer"
    lake.create_table("o", SCHEMA, location=outer + "/inner")
    with pytest.raises(ValidationError, match="contains the location of table 'default.o'"):
        lake.create_table("c", SCHEMA, location=outer)
    assert sorted(lake.tables()) == ["default.a", "default.o"]
    # a sibling whose name merely starts like another table's folder is its own place
    sibling = lake.create_table("s", SCHEMA, location=outer + "/inner2")
    sibling.append({"id": [2]})
    assert lake.table("o").to_arrow().num_rows == 0
    assert sibling.to_arrow().column("id").to_pylist() == [2]
    assert a.to_arrow().column("id").to_pylist() == [1]


def test_item12_location_holding_the_metastore_refused(tmp_path: Path) -> None:
    (tmp_path / "m" / "meta").mkdir(parents=True)
    lake = al.connect(f"sqlite:///{tmp_path}/m/meta/arrowlake.db",
                      warehouse=str(tmp_path / "warehouse"))
    try:
        with pytest.raises(ValidationError, match="metastore database"):
            lake.create_table("t", SCHEMA, location=str(tmp_path / "m" / "meta"))
        with pytest.raises(ValidationError, match="metastore database"):
            lake.create_table("t", SCHEMA, location=str(tmp_path / "m"))
        t = lake.create_table("t", SCHEMA, location=str(tmp_path / "elsewhere"))
        t.append({"id": [1]})
        assert t.to_arrow().num_rows == 1
    finally:
        lake.close()


def test_item12_orphans_of_a_table_at_the_root_skip_other_tables_and_metastore(
        lake: al.Lake) -> None:
    a = lake.create_table("a", SCHEMA)
    a.append({"id": [1]})
    root = legacy_table(lake, "default.b", lake.warehouse)
    stray = lake.warehouse + "/default/stray.parquet"  # not below any table's folder
    put_file(root, stray, b"junk")
    a_files = stored_paths(a)

    found = root.remove_orphan_files(older_than=dt.timedelta(0))
    assert found.files == [stray]
    root.remove_orphan_files(older_than=dt.timedelta(0), dry_run=False)
    assert stray not in stored_paths(root)
    assert stored_paths(a) == a_files
    assert a.to_arrow().column("id").to_pylist() == [1]
    lake.table("a").append({"id": [2]})  # the metastore still works

    lake.drop_table("default.b", purge=True)
    assert sorted(lake.table("a").to_arrow().column("id").to_pylist()) == [1, 2]


def test_item12_purge_of_a_table_sharing_a_location_keeps_the_other(lake: al.Lake) -> None:
    a = lake.create_table("a", SCHEMA)
    a.append({"id": [1]})
    c = legacy_table(lake, "default.c", a.location)
    c.append({"id": [7]})
    assert c.remove_orphan_files(older_than=dt.timedelta(0)).files == []
    # a's orphan removal does not take c's data files for orphans either
    assert a.remove_orphan_files(older_than=dt.timedelta(0)).files == []

    lake.drop_table("c", purge=True)
    assert a.to_arrow().column("id").to_pylist() == [1]


def test_item12_purge_of_an_enclosing_table_keeps_the_nested_one(lake: al.Lake) -> None:
    outer = legacy_table(lake, "default.outer", lake.warehouse + "/outer")
    outer.append({"id": [1]})
    inner = legacy_table(lake, "default.inner", lake.warehouse + "/outer/data/inner")
    inner.append({"id": [2]})
    inner_files = stored_paths(inner)
    assert inner_files
    assert not set(outer.remove_orphan_files(older_than=dt.timedelta(0)).files) & inner_files

    lake.drop_table("outer", purge=True)
    assert stored_paths(inner) == inner_files
    assert inner.to_arrow().column("id").to_pylist() == [2]
    assert not stored_paths(outer) - inner_files
