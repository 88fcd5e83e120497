"""Statistics and partition values that are easy to get wrong: decimals, NaN and -0.0, nulls
next to the string "__NULL__", and partition values too long for a directory name (defects
issue items 4, 5, 6 and 13)."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.expressions import col
from arrowlake.io.stats import (
    MAX_PARTITION_SEGMENT,
    STATS_VERSION_KEY,
    column_stats,
    merge_stats,
    partition_path,
)
from arrowlake.metastore import tables as mt
from arrowlake.schema import field_id

NAN = float("nan")
DEC = pa.decimal128(10, 2)


def decimals(*values: str | None) -> pa.Array:
    return pa.array([None if v is None else Decimal(v) for v in values], DEC)


def stored_stats(table: al.Table) -> list[tuple[int, dict]]:
    files = table._metastore.live_files(table._record.table_id, table.current_snapshot_id)
    return [(fid, json.loads(s)) for fid, s in zip(files.column("file_id").to_pylist(),
                                                   files.column("stats").to_pylist(),
                                                   strict=True)]


def set_stats(table: al.Table, file_id: int, stats: dict) -> None:
    """Store a file's statistics as an older version of arrowlake wrote them."""
    with table._metastore.engine.begin() as conn:
        conn.execute(mt.files.update().where(mt.files.c.file_id == file_id)
                     .values(stats=json.dumps(stats)))


# -- item 4: decimal statistics ---------------------------------------------------------------


def test_item4_decimal_stats_compare_as_numbers(sqlite_lake: al.Lake) -> None:
    t = sqlite_lake.create_table("d", pa.schema([("x", DEC)]),
                                 properties={"write.row-group-rows": "2"})
    t.append({"x": decimals("9.00", "9.50", "10.00", "10.50")})
    (_, stats), = stored_stats(t)
    fid = str(field_id(t.schema.field("x")))
    assert stats[fid][:2] == ["9.00", "10.50"]
    assert t.scan(filter="x = 9").count() == 1
    assert t.scan(filter="x > 10").count() == 1
    assert t.scan(filter="x = 9").to_arrow().column("x").to_pylist() == [Decimal("9.00")]
    assert t.scan(filter="x < 9.5").to_arrow().num_rows == 1
    t.delete("x >= 10")
    assert sorted(t.to_arrow().column("x").to_pylist()) == [Decimal("9.00"), Decimal("9.50")]


def test_item4_decimal_key_run_prunes_by_number(sqlite_lake: al.Lake) -> None:
    # A primary-key run of 32,768 rows is written in several row groups whose bounds were
    # merged as strings ("-0.01" < "-99.99"): `k > -50` found no rows.
    keys = pa.array([Decimal(i).scaleb(-2) for i in range(-10_000, 22_768)], DEC)
    t = sqlite_lake.create_table("pk", pa.schema([("k", DEC), ("v", pa.int64())]),
                                 primary_key=["k"], properties={"write.row-group-rows": "4096"})
    t.upsert(pa.table({"k": keys, "v": pa.array(range(len(keys)), pa.int64())}))
    def n(mask: pa.Array) -> int:
        return int(pc.sum(mask).as_py())

    d = Decimal
    for text, expected in [
        ("k > -50", n(pc.greater(keys, d("-50")))),
        ("k <= -99.99", n(pc.less_equal(keys, d("-99.99")))),
        ("k = 227.67", 1),
        ("k between -0.01 and 0.01", 3),
        ("k >= 100", n(pc.greater_equal(keys, d("100")))),
    ]:
        assert t.scan(filter=text).count() == expected, text
        assert t.scan(filter=text).to_arrow().num_rows == expected, text


def test_item4_old_decimal_stats_are_unknown_not_wrong(sqlite_lake: al.Lake) -> None:
    """Statistics written before the fix (no version, decimal bounds merged as strings) must
    not prune: they may exclude the very values the file holds."""
    t = sqlite_lake.create_table("d", pa.schema([("x", DEC), ("f", pa.float64())]),
                                 properties={"write.row-group-rows": "2"})
    t.append({"x": decimals("9.00", "9.50", "10.00", "10.50"), "f": [NAN, 1.0, 2.0, 3.0]})
    (file_id, stats), = stored_stats(t)
    xid, fid = (str(field_id(t.schema.field(c))) for c in ("x", "f"))
    old = {k: v for k, v in stats.items() if k != STATS_VERSION_KEY}
    old[xid] = ["10.00", "9.50", 0]  # what merging the row groups' bounds as strings gave
    old[fid] = [1.0, 3.0, 0]  # no NaN count
    set_stats(t, file_id, old)
    assert t.scan(filter="x = 9").count() == 1
    assert t.scan(filter="x > 10").to_arrow().num_rows == 1
    assert t.scan(filter="x < 9.6").count() == 2
    assert t.scan(filter="f != 2").count() == 3  # the NaN row too: the file may hold NaN
    assert t.scan(filter="not (f > 1.5)").count() == 2
    assert t.scan(filter="f <= 3").count() == 3
    t.delete("x < 9.6")
    assert t.count() == 2


def test_merge_stats_orders_decimals_by_value() -> None:
    schema = pa.schema([pa.field("x", DEC, metadata={b"PARQUET:field_id": b"1"})])
    chunks = [pa.table({"x": decimals(*vals)}, schema=schema)
              for vals in (["9.00", "9.50"], ["10.00", "-0.50"], [None, None])]
    merged = merge_stats([(column_stats(c, schema), c.num_rows) for c in chunks], schema)
    assert merged["1"] == ["-0.50", "10.00", 2]


# -- item 5: floats -----------------------------------------------------------------------------


def test_item5_float_filters_keep_zero_and_nan_rows(sqlite_lake: al.Lake) -> None:
    t = sqlite_lake.create_table("f", pa.schema([("x", pa.float64())]))
    t.append({"x": [0.0]})
    # pyarrow's row-group statistics are [-0.0, 0.0] here, and its pruning dropped the row.
    assert t.scan(filter="x in (0.0, 5.0)").count() == 1
    assert t.scan(filter="x in (0.0, 5.0)").to_arrow().num_rows == 1
    assert t.scan(filter="x = 0").count() == 1
    t.append({"x": [1.0, NAN]})
    # NaN != 1 is true, NaN <= 1 is not (Arrow's comparison kernels).
    assert t.scan(filter="x != 1").count() == 2
    assert t.scan(filter="x != 1").to_arrow().num_rows == 2
    assert t.scan(filter="x <= 1").count() == 2
    assert t.scan(filter="x <= 1").to_arrow().num_rows == 2
    assert t.scan(filter="not (x > 0.5)").count() == 2
    assert t.scan(filter="x not in (1.0)").count() == 2
    t.delete("x != 1")
    assert t.to_arrow().column("x").to_pylist() == [1.0]


def test_item5_negative_zero_equals_zero_everywhere(sqlite_lake: al.Lake) -> None:
    t = sqlite_lake.create_table("z", pa.schema([("x", pa.float32())]),
                                 properties={"write.row-group-rows": "1"})
    t.append({"x": pa.array([-0.0, 0.0, NAN, None], pa.float32())})
    x = col("x")
    for text, expected in [("x = 0", 2), ("x = -0.0", 2), ("x in (-0.0)", 2), ("x in (0.0)", 2),
                           ("x not in (0.0)", 1), (x.isin([NAN]), 0), (~x.isin([NAN]), 3),
                           (~x.isin([NAN, 0.0]), 1), (x.isin([NAN, -0.0]), 2),
                           ("x >= 0", 2), ("x < 0", 0), ("x != -0.0", 1), ("x is null", 1)]:
        assert t.scan(filter=text).count() == expected, text
        assert t.scan(filter=text).to_arrow().num_rows == expected, text


def test_item5_file_stats_count_nan(sqlite_lake: al.Lake) -> None:
    t = sqlite_lake.create_table("n", pa.schema([("x", pa.float64())]),
                                 properties={"write.row-group-rows": "2"})
    t.append({"x": [NAN, NAN, 1.0, None, 2.0]})
    t.append({"x": [3.0, 4.0]})
    fid = str(field_id(t.schema.field("x")))
    entries = sorted(stats[fid] for _, stats in stored_stats(t))
    assert entries == [[1.0, 2.0, 1, 2], [3.0, 4.0, 0, 0]]
    # A file without NaN is counted whole from its statistics, one with NaN is not skipped
    # for predicates NaN satisfies.
    assert t.scan(filter="x >= 3").count() == 2
    assert t.scan(filter="x != 2").count() == 5
    assert t.scan(filter="x > 10").files().num_rows == 0
    assert t.scan(filter="x != 3.5").files().num_rows == 2


def test_float_row_groups_are_not_pruned_by_pyarrow(sqlite_lake: al.Lake) -> None:
    """The Parquet files really carry the statistics pyarrow misreads (so the tests above
    exercise the reader, not only arrowlake's own statistics)."""
    t = sqlite_lake.create_table("g", pa.schema([("x", pa.float64())]))
    t.append({"x": [0.0, 0.0]})
    path = t.files().column("path")[0].as_py()
    stats = pq.ParquetFile(path).metadata.row_group(0).column(0).statistics
    assert (str(stats.min), str(stats.max)) == ("-0.0", "0.0")
    assert t.scan(filter="x in (0.0)").count() == 2


# -- item 6: null partitions --------------------------------------------------------------------


def test_item6_null_partition_is_not_the_string_null(lake: al.Lake) -> None:
    t = lake.create_table("p", pa.schema([("id", pa.int64()), ("p", pa.string())]),
                          partition_by=["p"])
    t.append({"id": [1], "p": ["__NULL__"]})
    t.append({"id": [2], "p": pa.array([None], pa.string())})
    t.append({"id": [3, 4], "p": pa.array([None, "__NULL__"], pa.string())})
    rows = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "p": "__NULL__"}, {"id": 2, "p": None}, {"id": 3, "p": None},
                    {"id": 4, "p": "__NULL__"}]
    assert sorted(t.scan(filter="p is null").to_arrow().column("id").to_pylist()) == [2, 3]
    assert t.scan(filter="p is null").count() == 2
    assert t.scan(filter="p = '__NULL__'").count() == 2
    assert t.scan(filter="p is not null").count() == 2
    assert len(set(t.files().column("partition").combine_chunks().field("p").to_pylist())) == 2
    t.delete("p is null")
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 4]


def test_item6_partitions_written_before_keep_reading(lake: al.Lake) -> None:
    """Partitions named as before the fix (a null, or the string, at ``p=__NULL__``) keep
    their rows, and new nulls get a partition of their own next to an old string one."""
    t = lake.create_table("p", pa.schema([("id", pa.int64()), ("p", pa.string())]),
                          partition_by=["p"])
    t.append({"id": [1], "p": ["__NULL__"]})
    old = lake.create_table("q", pa.schema([("id", pa.int64()), ("p", pa.string())]),
                            partition_by=["p"])
    old.append({"id": [1], "p": pa.array([None], pa.string())})
    c = mt.partitions.c
    with t._metastore.engine.begin() as conn:  # as written before: both at p=__NULL__
        for table, path in ((t, "p=__NULL__"), (old, "p=(null)")):
            assert conn.execute(mt.partitions.select().where(
                (c.table_id == table._record.table_id) & (c.path == path))).first() is not None
        conn.execute(mt.partitions.update().where(
            (c.table_id == old._record.table_id) & (c.path == "p=(null)"))
            .values(path="p=__NULL__"))
    t.append({"id": [2], "p": pa.array([None], pa.string())})
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "p": "__NULL__"}, {"id": 2, "p": None}]
    assert t.scan(filter="p is null").to_arrow().column("id").to_pylist() == [2]
    old.append({"id": [2], "p": pa.array([None], pa.string())})
    assert sorted(old.scan(filter="p is null").to_arrow().column("id").to_pylist()) == [1, 2]
    assert old.scan(filter="p is null").count() == 2
    assert old.to_arrow().column("p").to_pylist() == [None, None]
    # The new null went to p=(null) and joined the old null partition; the string "__NULL__"
    # now written into the old null's directory gets a partition of its own.
    old.append({"id": [3], "p": ["__NULL__"]})
    old.append({"id": [4], "p": ["__NULL__"]})
    assert sorted(old.scan(filter="p = '__NULL__'").to_arrow().column("id").to_pylist()) == [3, 4]
    assert sorted(old.scan(filter="p is null").to_arrow().column("id").to_pylist()) == [1, 2]
    assert sorted(old.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "p": None}, {"id": 2, "p": None}, {"id": 3, "p": "__NULL__"},
        {"id": 4, "p": "__NULL__"}]
    assert len(old._metastore.partitions(old._record.table_id)) == 2


def test_partition_paths_are_distinct_for_distinct_values() -> None:
    names = ["p"]
    values = [None, "__NULL__", "(null)", "%28null%29", "a" * 300, "a" * 299 + "b", "a=b",
              "a/b", "x" * 100]
    paths = [partition_path(names, [v]) for v in values]
    assert len(set(paths)) == len(paths)
    assert paths[:2] == ["p=(null)", "p=__NULL__"]  # the string keeps its (old) directory
    assert all(len(p.encode()) <= MAX_PARTITION_SEGMENT for p in paths)
    assert paths[-1] == "p=" + "x" * 100  # short values keep their (old) directory


# -- item 13: long partition values ------------------------------------------------------------


def test_item13_long_partition_strings_are_hashed_in_paths(lake: al.Lake) -> None:
    long_a = "a" * 300
    long_b = "a" * 299 + "b"
    wide = "é" * 200  # 400 bytes, 1,200 once percent-encoded
    t = lake.create_table("l", pa.schema([("id", pa.int64()), ("p", pa.string())]),
                          partition_by=["p"])
    t.append({"id": [1, 2, 3, 4], "p": [long_a, long_b, wide, "short"]})
    t.append({"id": [5], "p": [long_a]})
    rows = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["p"] for r in rows] == [long_a, long_b, wide, "short", long_a]
    assert t.scan(filter=f"p = '{long_a}'").count() == 2
    assert sorted(t.scan(filter=f"p = '{long_b}'").to_arrow().column("id").to_pylist()) == [2]
    assert t.scan(filter=f"p = '{long_a}'").files().num_rows == 2  # partitions prune
    partitions = t.files().column("partition").combine_chunks().field("p").to_pylist()
    assert sorted(set(partitions)) == sorted({long_a, long_b, wide, "short"})
    for path in t.files().column("path").to_pylist():
        assert all(len(part.encode()) <= MAX_PARTITION_SEGMENT for part in path.split("/"))
    t.delete(f"p = '{wide}'")
    assert t.count() == 4


def test_item13_long_partition_values_of_a_key_table(sqlite_lake: al.Lake) -> None:
    long_a = "k" * 1000
    t = sqlite_lake.create_table("lk", pa.schema([("k", pa.int64()), ("p", pa.string()),
                                                  ("v", pa.int64())]),
                                 primary_key=["k", "p"], partition_by=["p"], buckets=2)
    t.upsert({"k": [1, 2], "p": [long_a, long_a], "v": [1, 2]})
    t.upsert({"k": [1], "p": [long_a], "v": [10]})
    assert sorted(t.to_arrow().column("v").to_pylist()) == [2, 10]
    assert t.scan(filter=f"p = '{long_a}' and k = 1").to_arrow().column("v").to_pylist() == [10]


@pytest.mark.parametrize("producer", ["none", "lookup"])
def test_a_key_table_partition_at_an_old_path_keeps_its_keys(sqlite_lake: al.Lake,
                                                             producer: str) -> None:
    """A long partition value written before paths were hashed (its partition row holds the
    whole value as its path): new writes of that value join the old partition, so an upsert
    replaces the key there instead of adding a second version in a new partition."""
    long_a = "k" * 400
    t = sqlite_lake.create_table("lk", pa.schema([("k", pa.int64()), ("p", pa.string()),
                                                  ("v", pa.int64())]),
                                 primary_key=["k", "p"], partition_by=["p"], buckets=2,
                                 changelog_producer=producer)
    t.upsert({"k": [1, 2], "p": [long_a, long_a], "v": [1, 2]})
    c = mt.partitions.c
    with t._metastore.engine.begin() as conn:
        conn.execute(mt.partitions.update().where(c.table_id == t._record.table_id)
                     .values(path="p=" + long_a))
    t.upsert({"k": [1], "p": [long_a], "v": [10]})
    assert sorted(t.to_arrow().column("v").to_pylist()) == [2, 10]
    assert len(t._metastore.partitions(t._record.table_id)) == 1
    live = t._metastore.live_files(t._record.table_id, t.current_snapshot_id)
    assert len(set(live.column("partition_id").to_pylist())) == 1
    if producer == "lookup":
        change = list(t.stream(start=2, include_row_kind=True, stop_at_latest=True))
        rows = change[0].to_arrow().select(["_row_kind", "k", "v"]).to_pylist()
        assert rows == [{"_row_kind": "-U", "k": 1, "v": 1}, {"_row_kind": "+U", "k": 1, "v": 10}]
    t.compact(full=True)
    assert sorted(t.to_arrow().column("v").to_pylist()) == [2, 10]


def test_string_bounds_from_parquet_statistics_match_min_max(sqlite_lake: al.Lake) -> None:
    # Short strings take their bounds from the Parquet writer's statistics, longer ones from
    # min_max: both must give the bytewise (code point) bounds of each file, nulls skipped,
    # across row groups and with multi-byte characters (é sorts after z, 😀 after €).
    values = ["z", "é", None, "abc", "€uro", "😀", "", None, "y" * 40, "a" * 31, "zz"]
    t = sqlite_lake.create_table("s", pa.schema([("s", pa.string()), ("l", pa.large_string()),
                                                 ("n", pa.string())]),
                                 properties={"write.row-group-rows": "3"})
    for chunk in (values[:4], values[4:8], values[8:], values):
        t.append({"s": chunk, "l": list(reversed(chunk)), "n": [None] * len(chunk)})
    fids = {name: str(field_id(t.schema.field(name))) for name in ("s", "l", "n")}
    files = t._metastore.live_files(t._record.table_id, t.current_snapshot_id)
    by_path = dict(zip(files.column("path").to_pylist(), files.column("stats").to_pylist(),
                       strict=True))
    assert len(by_path) == 4
    for path, text in by_path.items():
        stats = json.loads(text)
        rows = pq.read_table(t._storage.join(t._record.location, path))
        for name in ("s", "l"):
            present = [v for v in rows.column(name).to_pylist() if v is not None]
            assert stats[fids[name]] == [min(present), max(present),
                                         rows.num_rows - len(present)], (path, name)
        assert stats[fids["n"]] == [None, None, rows.num_rows]
    assert t.scan(filter="s = 'é'").count() == 2
    above = sorted(v for v in values if v is not None and v > "zz") * 2
    assert sorted(t.scan(filter="s > 'zz'").to_arrow().column("s").to_pylist()) == sorted(above)
