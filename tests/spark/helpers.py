"""Data and comparisons shared by the Spark tests."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pyarrow as pa

from arrowlake.spark.types import spark_arrow_schema, spark_schema, to_spark_batch

#: A column of every kind of type a table can hold.
ALL_TYPES = pa.schema([
    ("id", pa.int64()), ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()),
    ("u8", pa.uint8()), ("u16", pa.uint16()), ("u32", pa.uint32()), ("u64", pa.uint64()),
    ("f16", pa.float16()), ("f32", pa.float32()), ("f64", pa.float64()), ("flag", pa.bool_()),
    ("s", pa.string()), ("ls", pa.large_string()), ("b", pa.binary()),
    ("lb", pa.large_binary()), ("fb", pa.binary(3)), ("d32", pa.date32()),
    ("d64", pa.date64()), ("ts_ns", pa.timestamp("ns")), ("ts_ms", pa.timestamp("ms")),
    ("ts_z", pa.timestamp("us", tz="Europe/Berlin")), ("ts_zs", pa.timestamp("s", tz="UTC")),
    ("t64", pa.time64("us")), ("t32", pa.time32("ms")), ("dur", pa.duration("us")),
    ("dec", pa.decimal128(18, 4)), ("dec38", pa.decimal128(38, 0)),
    ("dec60", pa.decimal256(60, 10)), ("ints", pa.list_(pa.int32())),
    ("words", pa.large_list(pa.string())), ("pair", pa.list_(pa.float64(), 2)),
    ("point", pa.struct([("x", pa.int32()), ("tag", pa.string())])),
    ("attrs", pa.map_(pa.string(), pa.int64())),
])


def all_types_data(n: int = 6) -> pa.Table:
    def pick(values, i):
        return None if i % 5 == 4 else values[i % len(values)]

    rows = range(n)
    cols = {
        "id": pa.array(list(rows), pa.int64()),
        "i8": [pick([-128, 0, 127], i) for i in rows],
        "i16": [pick([-32768, 7], i) for i in rows],
        "i32": [pick([-(2**31), 2**31 - 1], i) for i in rows],
        "u8": [pick([0, 255], i) for i in rows], "u16": [pick([65535], i) for i in rows],
        "u32": [pick([2**32 - 1], i) for i in rows],
        "u64": [pick([2**64 - 1, 0], i) for i in rows],
        "f16": pa.array([pick([1.5, -2.0], i) for i in rows], pa.float32()).cast(pa.float16()),
        "f32": [pick([1.25, float("inf")], i) for i in rows],
        "f64": [pick([1e300, -0.5, float("nan")], i) for i in rows],
        "flag": [pick([True, False], i) for i in rows],
        "s": [pick(["", "ünï", "x" * 300], i) for i in rows],
        "ls": [pick(["big", "str"], i) for i in rows],
        "b": [pick([b"\x00\x01", b""], i) for i in rows], "lb": [pick([b"lb"], i) for i in rows],
        "fb": [pick([b"abc", b"xyz"], i) for i in rows],
        "d32": [pick([date(2026, 11, 1), date(1900, 1, 1)], i) for i in rows],
        "d64": [pick([date(2000, 2, 29)], i) for i in rows],
        "ts_ns": pa.array([pick([1_700_000_000_123_456_789, 0], i) for i in rows],
                          pa.timestamp("ns")),
        "ts_ms": [pick([datetime(2026, 11, 1, 8, 30, 0, 123000)], i) for i in rows],
        "ts_z": [pick([datetime(2026, 3, 29, 1, 30, tzinfo=UTC)], i) for i in rows],
        "ts_zs": [pick([datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)], i) for i in rows],
        "t64": [pick([time(23, 59, 59, 999999), time(0)], i) for i in rows],
        "t32": [pick([time(12, 0, 0, 5000)], i) for i in rows],
        "dur": [pick([timedelta(days=2, microseconds=3)], i) for i in rows],
        "dec": [pick([Decimal("12345678901234.5678"), Decimal("-1.0000")], i) for i in rows],
        "dec38": [pick([Decimal(10**37)], i) for i in rows],
        "dec60": [pick([Decimal("1" * 50 + ".0123456789")], i) for i in rows],
        "ints": [pick([[1, None, 3], []], i) for i in rows],
        "words": [pick([["a", "b"]], i) for i in rows],
        "pair": [pick([[1.0, 2.0]], i) for i in rows],
        "point": [pick([{"x": 1, "tag": "p"}, {"x": None, "tag": None}], i) for i in rows],
        "attrs": [pick([[("k", 1), ("j", None)]], i) for i in rows],
    }
    return pa.table({f.name: pa.array(cols[f.name], f.type) if not isinstance(
        cols[f.name], pa.Array) else cols[f.name] for f in ALL_TYPES}, schema=ALL_TYPES)


def as_spark_rows(table: pa.Table, key: str | None = None) -> list[dict]:
    """``table`` as Spark would see it, as sorted rows (NaN made comparable)."""
    target = spark_arrow_schema(spark_schema(table.schema))
    batches = [to_spark_batch(b, target) for b in table.to_batches()]
    return _rows(pa.Table.from_batches(batches, schema=target), key)


def frame_rows(df, key: str | None = None) -> list[dict]:
    return _rows(df.toArrow(), key)


def _rows(table: pa.Table, key: str | None) -> list[dict]:
    rows = [{k: _comparable(v) for k, v in r.items()} for r in table.to_pylist()]
    sort_key = key or table.column_names[0]
    # Rows of equal key (the same id in two partitions) in an order of their own, not the
    # order the engine happened to give them in.
    return sorted(rows, key=lambda r: (repr(r[sort_key]) if r[sort_key] is not None else "",
                                       repr(r)))


def _comparable(value):
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


# -- tables for maintenance jobs ----------------------------------------------------------------

MAINTENANCE_SCHEMA = pa.schema([("day", pa.string()), ("id", pa.int64()), ("v", pa.float64())])


def fill_for_compaction(table) -> None:
    """Writes that leave each bucket of a primary-key table (partitioned by ``day``) several
    runs, updated and deleted rows among them: the same writes for every table given."""
    for step in range(4):
        ids = list(range(step * 5, step * 5 + 20))
        table.upsert(pa.table({"day": [f"d{i % 2}" for i in ids], "id": ids,
                               "v": [float(i * 10 + step) for i in ids]},
                              schema=MAINTENANCE_SCHEMA))
    table.delete("id < 3")


def compaction_table(lake, name: str, *, deletion_vectors: bool = False):
    table = lake.create_table(name, MAINTENANCE_SCHEMA, partition_by=["day"],
                              primary_key=["day", "id"], buckets=2,
                              deletion_vectors=deletion_vectors)
    fill_for_compaction(table)
    return table


def bucket_files(table) -> list[tuple]:
    """Per live file: (partition, bucket, rows, sequence range): the table's layout."""
    table.refresh()
    files = table._metastore.live_files(table._record.table_id, table.current_snapshot_id)
    paths = {pid: path for pid, path, _ in table._metastore.partitions(table._record.table_id)}
    return sorted(((paths.get(pid), *rest) for pid, *rest in zip(*(
        files.column(c).to_pylist() for c in (
            "partition_id", "bucket", "row_count", "seq_min", "seq_max")), strict=True)),
        key=repr)


def same_compaction(spark_result, local_result) -> None:
    """A Spark compaction did what the in-process one did (written bytes may differ: tasks
    choose encodings on their own rows)."""
    fields = ("buckets", "removed_files", "added_files", "removed_bytes", "dropped")
    assert {f: getattr(spark_result, f) for f in fields} == \
        {f: getattr(local_result, f) for f in fields}
    assert spark_result.snapshot_id is not None
