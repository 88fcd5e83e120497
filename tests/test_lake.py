"""The catalog: namespaces, tables, names, drop and rename, on SQLite and PostgreSQL."""

from __future__ import annotations

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import InvalidName, TableAlreadyExists, TableNotFound
from tests.conftest import ORDERS_SCHEMA, orders_data, stored_paths


def test_connect_path_keeps_sqlite_inside_the_lake(tmp_path):
    lake = al.connect(tmp_path / "lake")
    assert (tmp_path / "lake" / "arrowlake.db").exists()
    assert lake.warehouse == str(tmp_path / "lake")
    assert lake.metastore.dialect == "sqlite"


def test_connect_url_requires_warehouse(tmp_path):
    with pytest.raises(al.ValidationError, match="warehouse"):
        al.connect(f"sqlite:///{tmp_path}/meta.db")
    lake = al.connect(f"sqlite:///{tmp_path}/meta.db", warehouse=str(tmp_path / "data"))
    t = lake.create_table("a.b", pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}))
    assert t.location.startswith(str(tmp_path / "data"))


def test_create_list_load_tables(lake):
    lake.create_table("shop.orders", ORDERS_SCHEMA, partition_by=["day"])
    lake.create_table("shop.customers", pa.schema([("id", pa.int64())]))
    lake.create_table("plain", pa.schema([("id", pa.int64())]))
    assert lake.namespaces() == ["default", "shop"]
    assert lake.tables("shop") == ["shop.customers", "shop.orders"]
    assert lake.tables() == ["default.plain", "shop.customers", "shop.orders"]
    t = lake.table("shop.orders")
    assert t.schema.names == ORDERS_SCHEMA.names
    assert t.partition_by == ["day"]
    assert t.current_snapshot_id is None
    assert t.to_arrow().num_rows == 0


def test_field_ids_are_assigned(lake):
    schema = pa.schema(
        [
            ("a", pa.int64()),
            ("s", pa.struct([("x", pa.int32()), ("y", pa.list_(pa.string()))])),
            ("m", pa.map_(pa.string(), pa.float64())),
        ]
    )
    t = lake.create_table("n.t", schema)
    ids = [int(f.metadata[b"PARQUET:field_id"]) for f in t.schema]
    assert ids == sorted(set(ids))
    child = t.schema.field("s").type.field("x")
    assert int(child.metadata[b"PARQUET:field_id"]) > 0


def test_duplicate_table_and_missing_table(lake):
    lake.create_table("n.t", pa.schema([("a", pa.int64())]))
    with pytest.raises(TableAlreadyExists):
        lake.create_table("n.t", pa.schema([("a", pa.int64())]))
    assert lake.create_table("n.t", pa.schema([("a", pa.int64())]), exist_ok=True).name == "n.t"
    with pytest.raises(TableNotFound, match="n.nope"):
        lake.table("n.nope")


@pytest.mark.parametrize(
    "name", ["a/b", "../etc", "a..b", "ns.'t'", 'ns."t"', "a b", "", "a.b.c", "-x", "ns.t;drop"]
)
def test_bad_table_names(lake, name):
    with pytest.raises(InvalidName):
        lake.create_table(name, pa.schema([("a", pa.int64())]))
    assert lake.tables() == []


def test_drop_table_keeps_or_purges_files(lake):
    t = lake.create_table("n.t", pa.schema([("a", pa.int64())]))
    t.append(pa.table({"a": [1, 2]}))
    files = t.files().column("path").to_pylist()
    lake.drop_table("n.t")
    assert set(files) <= stored_paths(t)
    assert lake.tables() == []
    t2 = lake.create_table("n.t", pa.schema([("a", pa.int64())]))
    assert t2.location != t.location
    t2.append(pa.table({"a": [3]}))
    assert len(stored_paths(t2)) == 1
    lake.drop_table("n.t", purge=True)
    assert not stored_paths(t2)


def test_rename_table(lake):
    t = lake.create_table("n.t", ORDERS_SCHEMA)
    t.append(orders_data())
    renamed = lake.rename_table("n.t", "other.t2")
    assert lake.tables() == ["other.t2"]
    assert renamed.to_arrow().num_rows == 8
    with pytest.raises(TableNotFound):
        lake.table("n.t")


def test_metastore_schema_version_is_recorded(lake):
    import sqlalchemy as sa

    from arrowlake.metastore import tables as t

    with lake.metastore.engine.connect() as conn:
        version = conn.execute(
            sa.select(t.meta_info.c.value).where(t.meta_info.c.key == "version")
        ).scalar_one()
    assert int(version) == t.SCHEMA_VERSION


def test_newer_metastore_version_is_refused(tmp_path):

    from arrowlake.errors import MetastoreError
    from arrowlake.metastore import tables as t

    lake = al.connect(tmp_path / "lake")
    with lake.metastore.engine.begin() as conn:
        conn.execute(t.meta_info.update().values(value=str(t.SCHEMA_VERSION + 1)))
    lake.close()
    with pytest.raises(MetastoreError, match="upgrade arrowlake"):
        al.connect(tmp_path / "lake")


def test_partition_by_and_primary_key_accept_none_and_refuse_other_types(tmp_path):
    lake = al.connect(tmp_path / "lake")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    plain = lake.create_table("s.plain", schema, partition_by=None, primary_key=None)
    assert plain.primary_key == [] and plain.partition_by == []
    with pytest.raises(al.ValidationError, match="partition_by must be a column name"):
        lake.create_table("s.bad", schema, partition_by=3)
    assert not lake.table_exists("s.bad")
    lake.close()
