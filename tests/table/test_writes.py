"""append / overwrite / delete on tables without a primary key, and their snapshots."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import arrowlake as al
from arrowlake.errors import SchemaMismatch
from tests.conftest import ORDERS_SCHEMA, orders_data, sorted_rows


def test_append_returns_result_and_snapshot(orders):
    res = orders.append(orders_data(0, 8))
    assert res.snapshot_id == 1 and res.kind == "append"
    assert res.added_rows == 8 and res.added_files == 3  # three days, three partitions
    assert orders.current_snapshot_id == 1
    assert sorted_rows(orders.to_arrow()) == sorted_rows(orders_data(0, 8))
    res2 = orders.append(orders_data(8, 4))
    assert res2.snapshot_id == 2
    assert orders.count() == 12


def test_append_nothing_commits_nothing(orders):
    res = orders.append(ORDERS_SCHEMA.empty_table())
    assert res.snapshot_id is None
    assert orders.current_snapshot_id is None
    assert orders.snapshots().num_rows == 0


def test_hive_partition_directories(orders):
    orders.append(orders_data())
    paths = orders.files().column("path").to_pylist()
    assert {p.split("/")[-2] for p in paths} == {"day=2026-11-01", "day=2026-11-02",
                                                  "day=2026-11-03"}
    part = orders.files().column("partition").to_pylist()
    assert {p["day"] for p in part} == {date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)}


@pytest.mark.parametrize("kind", ["table", "batch", "reader", "pandas", "c_stream", "dict",
                                  "batches"])
def test_append_input_kinds(orders, kind):
    data = orders_data()
    if kind == "batch":
        inp = data.combine_chunks().to_batches()[0]
    elif kind == "reader":
        inp = pa.RecordBatchReader.from_batches(data.schema, data.to_batches(max_chunksize=3))
    elif kind == "pandas":
        inp = data.to_pandas()
    elif kind == "c_stream":
        class Stream:
            def __arrow_c_stream__(self, requested_schema=None):
                return data.__arrow_c_stream__(requested_schema)
        inp = Stream()
    elif kind == "dict":
        inp = data.to_pydict()
    elif kind == "batches":
        inp = iter(data.to_batches(max_chunksize=3))
    else:
        inp = data
    orders.append(inp)
    assert sorted_rows(orders.to_arrow()) == sorted_rows(data)


def test_real_tool_types_are_accepted(lake):
    """Polars-style views, pandas large strings and categoricals, timestamps in other units."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("blob", pa.binary()),
                        ("ts", pa.timestamp("us", tz="UTC")), ("cat", pa.string())])
    t = lake.create_table("n.types", schema)
    batch = pa.table({
        "id": pa.array([1, 2], pa.int32()),
        "name": pa.array(["x", "y"], pa.string_view()),
        "blob": pa.array([b"a", b"b"], pa.binary_view()),
        "ts": pa.array([datetime(2026, 1, 1, 12, tzinfo=UTC)] * 2,
                       pa.timestamp("ms", tz="Europe/Paris")),
        "cat": pa.array(["u", "v"]).dictionary_encode(),
    })
    t.append(batch)
    t.append(pa.table({"id": [3], "name": pa.array(["z"], pa.large_string()),
                       "blob": pa.array([b"c"], pa.large_binary()),
                       "ts": pa.array([0], pa.timestamp("s", tz="UTC")),
                       "cat": pa.array(["w"], pa.large_string())}))
    out = t.to_arrow().sort_by("id")
    assert out.schema.field("name").type == pa.string()
    assert out.column("name").to_pylist() == ["x", "y", "z"]
    assert out.column("ts")[0].as_py() == datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_polars_frame_is_written_directly(lake):
    pl = pytest.importorskip("polars")
    t = lake.create_table("n.pl", pa.schema([("a", pa.int64()), ("s", pa.string())]))
    t.append(pl.DataFrame({"a": [1, 2], "s": ["x", None]}))
    assert t.to_arrow().sort_by("a").column("s").to_pylist() == ["x", None]


@pytest.mark.parametrize("data, match", [
    (pa.table({"order_id": ["x"]}), "order_id.*int64.*string"),
    (pa.table({"nope": [1]}), "columns the table does not: 'nope'"),
    (pa.table({"order_id": pa.array([1.5])}), "order_id"),
    (pa.table({"day": pa.array([datetime(2026, 1, 1)], pa.timestamp("us"))}), "day"),
])
def test_wrong_types_are_refused_and_nothing_is_written(orders, data, match):
    orders.append(orders_data())
    before = orders.files().column("path").to_pylist()
    with pytest.raises(SchemaMismatch, match=match):
        orders.append(data)
    assert orders.current_snapshot_id == 1
    assert orders.files().column("path").to_pylist() == before
    assert orders.remove_orphan_files(older_than=__import__("datetime").timedelta(0)).files == []


def test_failure_mid_stream_leaves_no_files(orders):
    good = orders_data(0, 5).to_batches()[0]
    bad = pa.record_batch({"order_id": ["oops"]})

    def stream():
        yield good
        yield bad

    with pytest.raises(SchemaMismatch, match="batch 1"):
        orders.append(stream())
    assert orders.current_snapshot_id is None
    from datetime import timedelta
    assert orders.remove_orphan_files(older_than=timedelta(0)).files == []


def test_non_nullable_column(lake):
    t = lake.create_table("n.nn", pa.schema([pa.field("a", pa.int64(), nullable=False),
                                             ("b", pa.int64())]))
    with pytest.raises(SchemaMismatch, match="'a' is not nullable"):
        t.append(pa.table({"a": [1, None], "b": [1, 2]}))
    with pytest.raises(SchemaMismatch, match="missing"):
        t.append(pa.table({"b": [1]}))
    t.append(pa.table({"a": [1]}))  # b is nullable and filled with null
    assert t.to_arrow().to_pylist() == [{"a": 1, "b": None}]


def test_int_overflow_is_refused(lake):
    t = lake.create_table("n.i", pa.schema([("a", pa.int16())]))
    with pytest.raises(SchemaMismatch, match="'a'"):
        t.append(pa.table({"a": [1, 100_000]}))
    t.append(pa.table({"a": [1, 2]}))  # int64 values that fit are fine
    assert t.count() == 2


def test_overwrite_whole_table(orders):
    orders.append(orders_data(0, 8))
    res = orders.overwrite(orders_data(100, 3))
    assert res.kind == "overwrite" and res.removed_rows == 8 and res.added_rows == 3
    assert sorted_rows(orders.to_arrow()) == sorted_rows(orders_data(100, 3))
    assert orders.scan(snapshot=1).count() == 8


def test_overwrite_one_partition(orders):
    orders.append(orders_data(0, 9))
    day = date(2026, 11, 1)
    new = pa.table({"order_id": [1000, 1001], "day": [day, day], "customer": ["z", "z"],
                    "amount": [1.0, 2.0]})
    res = orders.overwrite(new, filter=al.col("day") == day)
    assert res.removed_rows == 3
    out = orders.to_arrow()
    assert sorted(out.filter(pc.equal(out["day"], day))["order_id"].to_pylist()) == [1000, 1001]
    assert out.num_rows == 9 - 3 + 2


def test_overwrite_refuses_rows_outside_filter(orders):
    orders.append(orders_data(0, 9))
    with pytest.raises(al.ValidationError, match="do not match the overwrite filter"):
        orders.overwrite(orders_data(0, 3), filter="day = '2026-11-01'")
    assert orders.current_snapshot_id == 1
    assert orders.count() == 9


def test_delete_rewrites_only_affected_files(orders):
    orders.append(orders_data(0, 12))
    before = {p: 1 for p in orders.files().column("path").to_pylist()}
    res = orders.delete("amount < 0")  # amounts -3.0 and -1.5: ids 0 and 1
    assert res.removed_rows == 2
    out = orders.to_arrow()
    assert sorted(out["order_id"].to_pylist()) == list(range(2, 12))
    after = orders.files().column("path").to_pylist()
    assert len(set(after) & set(before)) == 1  # day 2026-11-03 holds neither id 0 nor id 1


def test_delete_whole_partition_without_reading(orders):
    orders.append(orders_data(0, 12))
    res = orders.delete(al.col("day") == date(2026, 11, 2))
    assert res.removed_rows == 4 and res.added_files == 0
    assert orders.count() == 8


def test_delete_nothing_matching(orders):
    orders.append(orders_data(0, 4))
    res = orders.delete("amount > 1000")
    assert res.snapshot_id is None
    assert orders.current_snapshot_id == 1


def test_delete_keeps_rows_where_filter_is_null(lake):
    t = lake.create_table("n.nulls", pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    t.append(pa.table({"a": [1, 2, 3], "b": [None, 5, 10]}))
    t.delete("b > 6")
    assert sorted(t.to_arrow()["a"].to_pylist()) == [1, 2]


def test_snapshots_table(orders):
    orders.append(orders_data(0, 4))
    orders.append(orders_data(4, 4))
    orders.delete("order_id = 0")
    snaps = orders.snapshots()
    for name in ["snapshot_id", "parent_id", "kind", "committed_at", "added_rows",
                 "removed_rows", "added_files", "removed_files", "total_rows"]:
        assert name in snaps.column_names
    assert snaps["snapshot_id"].to_pylist() == [1, 2, 3]
    assert snaps["parent_id"].to_pylist() == [None, 1, 2]
    assert snaps["kind"].to_pylist() == ["append", "append", "delete"]
    assert snaps["total_rows"].to_pylist() == [4, 8, 7]
    assert snaps.schema.field("committed_at").type == pa.timestamp("ms", tz="UTC")


def test_commit_id_makes_append_idempotent(orders):
    r1 = orders.append(orders_data(0, 4), commit_id="batch-7")
    r2 = orders.append(orders_data(0, 4), commit_id="batch-7")
    assert r2.duplicate and r2.snapshot_id == r1.snapshot_id
    assert orders.count() == 4
    from datetime import timedelta
    assert orders.remove_orphan_files(older_than=timedelta(0)).files == []


def test_target_file_size_rolls_files(lake):
    t = lake.create_table("n.big", pa.schema([("a", pa.int64()), ("s", pa.string())]),
                          properties={"write.target-file-size": 20_000,
                                      "write.row-group-rows": 1000})
    n = 20_000
    t.append(pa.table({"a": pa.array(range(n), pa.int64()),
                       "s": pa.array([f"value-{i * 7919 % 100003}" for i in range(n)])}))
    files = t.files()
    assert files.num_rows > 1
    assert sum(files["row_count"].to_pylist()) == n
    assert t.count() == n


def test_files_statistics(orders):
    orders.append(orders_data(0, 6))
    files = orders.files()
    assert {"min.order_id", "max.order_id", "nulls.order_id", "min.amount"} <= set(
        files.column_names)
    assert sum(files["row_count"].to_pylist()) == 6
    assert pc.min(files["min.order_id"]).as_py() == 0
    assert pc.max(files["max.order_id"]).as_py() == 5


def _encodings(table: al.Table) -> dict[str, set[str]]:
    """Per column, the Parquet encodings used in the table's data files."""
    import pyarrow.parquet as pq

    used: dict[str, set[str]] = {}
    for path in table.files()["path"].to_pylist():
        metadata = pq.ParquetFile(path).metadata
        for g in range(metadata.num_row_groups):
            for c in range(metadata.num_columns):
                chunk = metadata.row_group(g).column(c)
                used.setdefault(chunk.path_in_schema, set()).update(chunk.encodings)
    return used


ENCODED_TYPES = pa.schema([
    ("i8", pa.int8()), ("u64", pa.uint64()), ("i64", pa.int64()), ("d", pa.date32()),
    ("ts", pa.timestamp("ns", tz="Asia/Tokyo")), ("t", pa.time64("us")),
    ("dur", pa.duration("ms")), ("f32", pa.float32()), ("f64", pa.float64()),
    ("s", pa.string()), ("ls", pa.large_string()), ("b", pa.binary()),
    ("dec", pa.decimal128(12, 3)), ("flag", pa.bool_()), ("tags", pa.list_(pa.string())),
    ("few", pa.string()),
])


def _encoded_rows(n: int) -> pa.Table:
    from decimal import Decimal

    import numpy as np

    rng = np.random.default_rng(3)
    ints = rng.integers(-(1 << 40), 1 << 40, n)

    def nulls(values: pa.Array) -> pa.Array:  # every 7th value null, in every column
        return pc.if_else(pa.array(np.arange(n) % 7 == 0), pa.nulls(n, values.type), values)

    columns = {
        "i8": pa.array(ints % 100, pa.int8()), "u64": pa.array(np.abs(ints), pa.uint64()),
        "i64": pa.array(ints), "d": pa.array(ints % 20000, pa.int32()).cast(pa.date32()),
        "ts": pa.array(ints, pa.timestamp("ns", tz="Asia/Tokyo")),
        "t": pa.array(np.abs(ints) % 86_400_000_000, pa.time64("us")),
        "dur": pa.array(ints, pa.duration("ms")), "f32": pa.array(rng.random(n), pa.float32()),
        "f64": pa.array(rng.standard_normal(n)),
        "s": pa.array([f"row-{v}" for v in ints.tolist()]),
        "ls": pa.array([f"x{v}" * 3 for v in ints.tolist()], pa.large_string()),
        "b": pa.array([v.to_bytes(8, "little", signed=True) for v in ints.tolist()]),
        "dec": pa.array([Decimal(v % 10**9).scaleb(-3) for v in ints.tolist()],
                        pa.decimal128(12, 3)),
        "flag": pa.array(ints % 2 == 0), "tags": pa.array([[str(v)] for v in ints.tolist()]),
        "few": pa.array(["eu", "us"] * (n // 2)),
    }
    return pa.table({k: nulls(v) for k, v in columns.items()}, schema=ENCODED_TYPES)


def test_files_use_encodings_by_type_and_read_back_exactly(sqlite_lake):
    """Integers and temporals delta-encoded, floats plain (byte-stream-split is opt-in:
    tests/io/test_encodings.py), distinct strings delta-length, repetitive columns
    dictionary-encoded; every value (and null) reads back."""
    t = sqlite_lake.create_table("n.enc", ENCODED_TYPES)
    rows = _encoded_rows(20_000)
    t.append(rows)
    used = _encodings(t)
    for name in ("u64", "i64", "d", "ts", "t", "dur"):
        assert "DELTA_BINARY_PACKED" in used[name], (name, used[name])
    for name in ("f32", "f64"):
        assert "BYTE_STREAM_SPLIT" not in used[name], (name, used[name])
    for name in ("s", "ls", "b"):
        assert "DELTA_LENGTH_BYTE_ARRAY" in used[name], (name, used[name])
    assert "RLE_DICTIONARY" in used["few"] and "RLE_DICTIONARY" in used["i8"]  # 100 values
    assert t.to_arrow().equals(rows)
    assert t.scan(filter="i64 >= 0 and f64 < 0.5", columns=["i64", "s"]).to_arrow().equals(
        rows.filter(pc.and_(pc.greater_equal(rows["i64"], 0), pc.less(rows["f64"], 0.5)))
        .select(["i64", "s"]))


def test_plain_encodings_property(sqlite_lake):
    t = sqlite_lake.create_table("n.plain", ENCODED_TYPES,
                                 properties={"write.encodings": "plain"})
    rows = _encoded_rows(2_000)
    t.append(rows)
    used = _encodings(t)
    newer = {"DELTA_BINARY_PACKED", "BYTE_STREAM_SPLIT", "DELTA_LENGTH_BYTE_ARRAY"}
    assert not any(encodings & newer for encodings in used.values()), used
    assert t.to_arrow().equals(rows)


@pytest.mark.parametrize("name, value", [
    ("write.encodings", "fancy"), ("write.compression", "zip"),
    ("write.row-group-rows", "0"), ("write.target-file-size", "1e6"),
    ("write.buffer-size", "-5"), ("write.compression-level", "high"),
])
def test_malformed_write_properties_are_refused(sqlite_lake, name, value):
    with pytest.raises(al.errors.ValidationError, match=name):
        sqlite_lake.create_table("n.bad", ORDERS_SCHEMA, properties={name: value})
    assert not sqlite_lake.table_exists("n.bad")
    t = sqlite_lake.create_table("n.good", ORDERS_SCHEMA)
    with pytest.raises(al.errors.ValidationError, match=name):
        t.set_properties(**{name: value})
    assert name not in t.refresh().properties
