"""Schema evolution: files written before a change read correctly under the new schema."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from arrowlake.errors import ColumnNotFound, InvalidName, SchemaMismatch


@pytest.fixture
def people(lake):
    t = lake.create_table("n.people", pa.schema([("id", pa.int32()), ("name", pa.string()),
                                                 ("score", pa.float32())]))
    t.append(pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["ann", "bob"],
                       "score": pa.array([1.5, 2.5], pa.float32())}))
    return t


def test_add_column_reads_null_for_old_files(people):
    people.add_column("email", pa.string())
    people.append(pa.table({"id": pa.array([3], pa.int32()), "name": ["cy"],
                            "score": pa.array([3.0], pa.float32()), "email": ["c@x"]}))
    out = people.to_arrow().sort_by("id")
    assert out["email"].to_pylist() == [None, None, "c@x"]
    assert people.scan(filter="email is null").count() == 2
    assert people.scan(filter="email = 'c@x'", columns=["id"]).to_arrow()["id"].to_pylist() == [3]


def test_rename_keeps_data_and_filters(people):
    people.rename_column("name", "full_name")
    out = people.to_arrow().sort_by("id")
    assert out.column_names == ["id", "full_name", "score"]
    assert out["full_name"].to_pylist() == ["ann", "bob"]
    assert people.scan(filter="full_name = 'bob'").count() == 1
    with pytest.raises(ColumnNotFound):
        people.scan(filter="name = 'bob'")


def test_drop_then_add_same_name_is_a_new_column(people):
    people.drop_column("score")
    assert people.to_arrow().column_names == ["id", "name"]
    people.add_column("score", pa.float64())
    assert people.to_arrow()["score"].to_pylist() == [None, None]  # old values stay dropped


def test_widen_types(people):
    people.alter_column("id", pa.int64())
    people.alter_column("score", pa.float64())
    people.append(pa.table({"id": [2**40], "name": ["big"], "score": [0.1]}))
    out = people.to_arrow().sort_by("id")
    assert out.schema.field("id").type == pa.int64()
    assert out["id"].to_pylist() == [1, 2, 2**40]
    assert out["score"].to_pylist()[:2] == [1.5, 2.5]
    assert people.scan(filter="id > 1").count() == 2


def test_narrowing_and_nonsense_changes_are_refused(people):
    with pytest.raises(SchemaMismatch, match="only widening"):
        people.alter_column("id", pa.int16())
    with pytest.raises(SchemaMismatch, match="only widening"):
        people.alter_column("name", pa.int64())
    with pytest.raises(SchemaMismatch, match="exists already"):
        people.add_column("name", pa.string())
    with pytest.raises(SchemaMismatch, match="nullable"):
        people.add_column("x", pa.int64(), nullable=False)
    with pytest.raises(InvalidName):
        people.add_column("a/b", pa.int64())
    assert people.schema.names == ["id", "name", "score"]


def test_partition_column_cannot_be_dropped(lake):
    t = lake.create_table("n.p", pa.schema([("d", pa.string()), ("v", pa.int64())]),
                          partition_by=["d"])
    with pytest.raises(SchemaMismatch, match="partitioned"):
        t.drop_column("d")


def test_time_travel_uses_the_snapshot_schema(people):
    first = people.current_snapshot_id
    people.drop_column("score")
    people.append(pa.table({"id": pa.array([3], pa.int32()), "name": ["cy"]}))
    assert people.scan(snapshot=first).to_arrow().column_names == ["id", "name", "score"]
    assert people.to_arrow().column_names == ["id", "name"]


def test_nested_decimal_and_timezone_types_round_trip(lake):
    schema = pa.schema([
        ("id", pa.int64()),
        ("point", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        ("tags", pa.list_(pa.string())),
        ("attrs", pa.map_(pa.string(), pa.int64())),
        ("price", pa.decimal128(12, 2)),
        ("at", pa.timestamp("ns", tz="America/New_York")),
    ])
    t = lake.create_table("n.nested", schema)
    data = pa.table({
        "id": [1, 2],
        "point": [{"x": 1.0, "y": 2.0}, None],
        "tags": [["a", "b"], []],
        "attrs": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
        "price": pa.array([Decimal("1.25"), Decimal("99.99")], pa.decimal128(12, 2)),
        "at": pa.array([1_700_000_000_000_000_000, None],
                       pa.timestamp("ns", tz="America/New_York")),
    })
    t.append(data)
    out = t.to_arrow().sort_by("id")
    assert out.to_pylist() == data.to_pylist()
    assert out.schema.field("at").type == pa.timestamp("ns", tz="America/New_York")
    assert t.scan(filter="price > 10").to_arrow()["id"].to_pylist() == [2]
