"""``Scan.to_duckdb()``: a lazy relation over the table's files that holds exactly the rows
``Scan.to_arrow()`` returns, through schema evolution, filters, deletion vectors and merges."""

from __future__ import annotations

import math
from collections import Counter
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import ValidationError

duckdb = pytest.importorskip("duckdb")


def _value(v: object) -> object:
    if isinstance(v, pa.MonthDayNano):  # DuckDB's INTERVAL, a duration in Arrow
        return timedelta(days=v.days, microseconds=v.nanoseconds // 1000)
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


def rows_of(table: pa.Table) -> Counter:
    return Counter(tuple(_value(v) for v in row.values()) for row in table.to_pylist())


def assert_same(scan: al.Scan, con: object = None) -> object:
    """The relation of ``scan`` holds the rows of ``scan.to_arrow()``, with its columns."""
    rel = scan.to_duckdb(con)
    expected = scan.to_arrow()
    got = rel.to_arrow_table()
    assert got.column_names == expected.column_names
    assert rows_of(got) == rows_of(expected), str(scan.expr)
    return rel


def plan_of(rel: object) -> str:
    return rel.explain().upper()


# -- an append table: schema evolution, partitions, filters ------------------------------------

V1 = pa.schema([("id", pa.int32()), ("name", pa.string()), ("amount", pa.float32()),
                ("price", pa.decimal128(10, 2)), ("ts", pa.timestamp("ms")),
                ("day", pa.date32()), ("part", pa.string()), ("flag", pa.bool_()),
                ("t", pa.time64("us"))])


def _v1_rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int32()),
        "name": [None if i % 9 == 0 else ["alpha", "o'k", "beta", 'q"x', "al%"][i % 5]
                 for i in ids],
        "amount": pa.array([float("nan") if i % 11 == 0 else -0.0 if i % 13 == 0
                            else (i % 7) * 0.5 - 1.0 for i in ids], pa.float32()),
        "price": pa.array([Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
        "ts": pa.array([datetime(2026, 1, 1) + timedelta(milliseconds=250 * i) for i in ids],
                       pa.timestamp("ms")),
        "day": pa.array([date(2026, 11, 1 + i % 3) for i in ids], pa.date32()),
        "part": [["a", "b", "c"][i % 3] for i in ids],
        "flag": [i % 2 == 0 for i in ids],
        "t": pa.array([time(9 + i % 4) for i in ids], pa.time64("us")),
    })


def make_evolved(lake: al.Lake) -> al.Table:
    """Three schema versions: the first's files, then renamed / widened / added columns."""
    t = lake.create_table("s.evolved", V1, partition_by=["part"])
    t.append(_v1_rows(0, 60))
    t.rename_column("name", "label")
    t.alter_column("id", pa.int64())
    t.alter_column("amount", pa.float64())
    t.alter_column("price", pa.decimal128(12, 2))
    t.add_column("extra", pa.int16())
    second = _v1_rows(60, 40).rename_columns(
        ["id", "label", "amount", "price", "ts", "day", "part", "flag", "t"])
    second = second.append_column("extra", pa.array([i % 5 for i in range(40)], pa.int16()))
    t.append(second)
    t.rename_column("label", "title")  # a third version, no files of its own
    t.append(pa.table({"id": pa.array([3_000_000_000], pa.int64()), "title": ["late"],
                       "part": ["a"], "extra": pa.array([None], pa.int16())}))
    return t


@pytest.fixture(scope="module")
def evolved(tmp_path_factory: pytest.TempPathFactory):
    """Shared by the read-only tests of this module (built once)."""
    with al.connect(tmp_path_factory.mktemp("duckdb") / "lake") as lake:
        yield make_evolved(lake)


def test_relation_over_evolved_files_equals_to_arrow(evolved):
    scan = evolved.scan()
    rel = assert_same(scan)
    plan = plan_of(rel)
    # DuckDB reads every file itself: nothing went through Arrow.
    assert "READ_PARQUET" in plan and "ARROW" not in plan
    assert rel.columns == ["id", "title", "amount", "price", "ts", "day", "part", "flag", "t",
                           "extra"]
    assert [str(t) for t in rel.types][:5] == ["BIGINT", "VARCHAR", "DOUBLE", "DECIMAL(12,2)",
                                               "TIMESTAMP_MS"]
    assert_same(evolved.scan(columns=["extra", "title"]))
    assert_same(evolved.scan(columns=["part"], filter="part = 'b'"))


FILTERS = [
    "id > 30",
    "id >= 3000000000",  # beyond the int32 the first files hold
    "id = 2.5",  # a fractional literal compares the column as float64
    "id < 10.5 AND id != 3",
    "title = 'o''k'",
    "title = 'q\"x'",
    "title LIKE 'al%'",
    "title LIKE 'al\\%%'",
    "title NOT LIKE 'al%'",
    "title IS NULL",
    "title > part",
    "amount > 0.5",
    "amount != 0.5",
    "amount = 0",
    "amount >= 0",
    "amount <= -0.0",
    "amount > -0.5 AND amount < 0.5",
    "NOT (amount >= 0.5)",
    "amount IN (0.5, -1.0)",
    "amount NOT IN (0.5)",
    "NOT (amount <= 0.5)",
    "amount = 'NaN'",
    "amount != 'NaN'",
    "price >= 10.25",
    "price = 10.255",  # finer than the column's scale
    "price IN (1, 2.5, 3.75)",
    "ts > '2026-01-01 00:00:05'",
    "ts >= '2026-01-01 00:00:05.0005'",  # finer than the column's milliseconds
    "day = '2026-11-02'",
    "day IN ('2026-11-01', '2026-11-03') AND part != 'a'",
    "extra IS NULL",
    "extra IS NOT NULL AND extra < 3",
    "id < extra",
    "id NOT IN (1, 2, 3)",
    "id NOT IN (1, NULL)",
    "id IN (4, NULL)",
    "part = 'b' OR amount < 0",
    "NOT (part = 'b' OR flag = TRUE)",
    "flag = FALSE",
]


@pytest.mark.parametrize("text", FILTERS)
def test_filters_equal_to_arrow(evolved, text):
    scan = evolved.scan(filter=text)
    rel = assert_same(scan)
    if scan.plan():  # (a filter statistics rule out everywhere plans no file)
        assert "ARROW" not in plan_of(rel)
    assert_same(evolved.scan(filter=text, columns=["title"]))


def test_filter_without_sql_form_is_applied_by_arrow(evolved):
    # Time literals have no typed SQL form here: the scan is read through arrowlake's reader.
    scan = evolved.scan(filter=al.col("t") >= time(10), columns=["id", "t"])
    rel = assert_same(scan)
    assert "ARROW" in plan_of(rel)
    assert rel.aggregate("count(*)").fetchall()[0][0] == scan.count() > 0


def test_relation_is_lazy(sqlite_lake):
    evolved = make_evolved(sqlite_lake)
    rel = evolved.scan(filter="part = 'c'").to_duckdb()
    plan = plan_of(rel)
    assert "READ_PARQUET" in plan and "ARROW" not in plan
    # Nothing was read yet: a file gone now fails the query that reads it.
    paths = evolved.scan(filter="part = 'c'").plan()[0].files
    Path(paths[0].path).unlink()
    with pytest.raises(duckdb.Error):
        rel.fetchall()


def test_registered_name_and_limit(evolved):
    con = duckdb.connect()
    evolved.scan(filter="part = 'a'").to_duckdb(con, name="evolved_a")
    count = con.sql("SELECT count(*) FROM evolved_a WHERE title = 'beta'").fetchall()[0][0]
    assert count == evolved.scan(filter="part = 'a' AND title = 'beta'").count() > 0
    rel = evolved.scan(limit=7).to_duckdb(con)
    assert len(rel.fetchall()) == 7


def test_no_columns_is_a_clear_error(evolved):
    with pytest.raises(ValidationError, match="at least one column"):
        evolved.scan(columns=[]).to_duckdb()


def test_string_view_and_large_string_inputs(sqlite_lake):
    schema = pa.schema([("k", pa.int64()), ("sv", pa.string_view()), ("ls", pa.large_string()),
                        ("lb", pa.large_binary())])
    t = sqlite_lake.create_table("s.strings", schema)
    for start in (0, 50):
        ks = list(range(start, start + 50))
        t.append(pa.table({
            "k": ks,
            "sv": pa.array([None if k % 13 == 0 else f"v{k % 6}" if k % 5 else "é"
                            for k in ks], pa.string_view()),
            "ls": pa.array([f"l{k % 4}'" for k in ks], pa.large_string()),
            "lb": pa.array([bytes([k % 3, 0]) for k in ks], pa.large_binary()),
        }))
    for text in [None, "sv = 'v1'", "sv LIKE 'v%' AND ls != 'l2'''", "sv >= ls",
                 "ls IN ('l1''', 'l3''')", "sv > 'v3'", "sv < 'z'", "lb = X'0100'",
                 "sv IS NULL OR k > 90"]:
        rel = assert_same(t.scan(filter=text))
        assert "ARROW" not in plan_of(rel)


def test_timestamps_of_every_unit_and_zone(sqlite_lake):
    base = datetime(2026, 3, 1, 12)
    schema = pa.schema([("k", pa.int64()), ("s", pa.timestamp("s")),
                        ("ms_tz", pa.timestamp("ms", "UTC")),
                        ("us_tz", pa.timestamp("us", "Europe/Paris")),
                        ("ns", pa.timestamp("ns")), ("ns_tz", pa.timestamp("ns", "Asia/Tokyo"))])
    t = sqlite_lake.create_table("s.times", schema)
    ks = list(range(40))
    ns = [int(base.timestamp()) * 10**9 + k * 250_000_123 for k in ks]
    t.append(pa.table({
        "k": ks,
        "s": pa.array([base + timedelta(seconds=k) for k in ks], pa.timestamp("s")),
        "ms_tz": pa.array([v // 10**6 for v in ns], pa.timestamp("ms", "UTC")),
        "us_tz": pa.array([v // 10**3 for v in ns], pa.timestamp("us", "Europe/Paris")),
        "ns": pa.array(ns, pa.timestamp("ns")),
        "ns_tz": pa.array(ns, pa.timestamp("ns", "Asia/Tokyo")),
    }, schema=schema))
    for text in ["s > '2026-03-01 12:00:10'", "s >= '2026-03-01 12:00:10.5'",
                 "ms_tz < '2026-03-01 12:00:03.251'", "ms_tz = '2026-03-01 13:00:00.250+01:00'",
                 "us_tz >= '2026-03-01 12:00:02.000000'", "ns > '2026-03-01 12:00:01.500000246'",
                 "ns = '2026-03-01 12:00:00.250000123'", "ns_tz <= '2026-03-01 21:00:03+09:00'",
                 "s IN ('2026-03-01 12:00:01', '2026-03-01 12:00:05')"]:
        rel = assert_same(t.scan(filter=text))
        assert "ARROW" not in plan_of(rel)
        assert rel.aggregate("count(*)").fetchall()[0][0] == t.scan(filter=text).count()


def test_column_names_are_quoted(sqlite_lake):
    schema = pa.schema([("we\"ird 'name", pa.int64()), ("select", pa.string())])
    t = sqlite_lake.create_table("s.names", schema)
    t.append(pa.table({"we\"ird 'name": [1, 2, 3], "select": ["a", "b'", None]}))
    t.rename_column("select", "from x")
    t.append(pa.table({"we\"ird 'name": [4], "from x": ["b'"]}))
    filt = al.col("we\"ird 'name") > 1
    for f in [None, filt, filt & (al.col("from x") == "b'")]:
        rel = assert_same(t.scan(filter=f))
        assert "ARROW" not in plan_of(rel)


def test_column_types_duckdb_reads_differently_go_through_arrow(sqlite_lake):
    # A duration is stored as an int64; DuckDB would read it as BIGINT, not INTERVAL.
    schema = pa.schema([("k", pa.int64()), ("d", pa.duration("us"))])
    t = sqlite_lake.create_table("s.durations", schema)
    t.append(pa.table({"k": [1, 2], "d": pa.array([5, 7], pa.duration("us"))}))
    rel = assert_same(t.scan(filter="k > 1"))
    assert "ARROW" in plan_of(rel)
    # Without that column, the same files are read by DuckDB.
    assert "ARROW" not in plan_of(assert_same(t.scan(columns=["k"])))


# -- primary-key tables ----------------------------------------------------------------------

PK = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string()),
                ("v", pa.int64()), ("s", pa.int64())])


def test_deletion_vectors_are_applied_including_puffin_ones(sqlite_lake):
    # Small row groups: DuckDB skips some by their statistics, and positions still count
    # from each file's first row.
    t = sqlite_lake.create_table("s.dv", PK, primary_key=["id"], buckets=2,
                                 deletion_vectors=True,
                                 properties={"write.row-group-rows": "2048"})
    n = 50_000
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": list(range(n)), "s": [0] * n})
    replaced = list(range(0, n, 7))  # spread over the whole file: vectors of many KiB
    t.upsert({"id": replaced, "p": ["b"] * len(replaced), "v": [-1] * len(replaced),
              "s": [1] * len(replaced)})
    vectors = t._metastore.live_vectors(t._record.table_id, t.current_snapshot_id)
    assert any(v.puffin_path is not None for v in vectors.values())
    rel = assert_same(t.scan())
    plan = plan_of(rel)
    assert "ANTI" in plan and "READ_PARQUET" in plan and "ARROW_SCAN" in plan
    assert len(rel.fetchall()) == n
    t.delete("id < 1000 OR v = 35")
    t.upsert({"id": [1, 3, 70_000], "p": ["c"] * 3, "v": [9] * 3, "s": [2] * 3})
    for text in [None, "p = 'b'", "v = -1 AND id < 700", "p = 'c' OR id = 7"]:
        assert_same(t.scan(filter=text))
    assert_same(t.scan(columns=["v"], filter="p != 'a'"))


def test_merge_on_read_buckets_are_merged_by_arrowlake(sqlite_lake):
    t = sqlite_lake.create_table("s.mor", PK, primary_key=["p", "id"], partition_by=["p"])
    t.upsert({"id": list(range(40)), "p": ["a"] * 40, "v": list(range(40)), "s": [0] * 40})
    t.upsert({"id": list(range(0, 40, 3)), "p": ["a"] * 14, "v": [-1] * 14, "s": [1] * 14})
    t.upsert({"id": list(range(10)), "p": ["b"] * 10, "v": list(range(10)), "s": [0] * 10})
    t.delete("p = 'a' AND id = 4")
    rel = assert_same(t.scan())
    plan = plan_of(rel)
    # Partition b's one run needs no merge and is read by DuckDB; a's runs are merged.
    assert "READ_PARQUET" in plan and "ARROW" in plan
    for text in ["v = -1", "p = 'b' AND v > 4", "id = 4"]:
        assert_same(t.scan(filter=text))
    # As a view, the rows read through arrowlake stay with it.
    con = duckdb.connect()
    t.scan().to_duckdb(con, name="mor")
    assert con.sql("SELECT count(*) FROM mor").fetchall()[0][0] == t.count() == 49


def test_partition_columns_come_from_the_files(sqlite_lake):
    # Directory names escape and stand in for values ("(null)", "__NULL__", "a%20b%2Fc"):
    # the relation reads the values the files store.
    schema = pa.schema([("id", pa.int64()), ("p", pa.string()), ("n", pa.int32()),
                        ("d", pa.date32())])
    t = sqlite_lake.create_table("s.parts", schema, partition_by=["p", "n", "d"])
    t.append(pa.table({"id": [1, 2, 3, 4], "p": ["a b/c", None, "__NULL__", "x=1" * 100],
                       "n": pa.array([1, 2, None, -3], pa.int32()),
                       "d": pa.array([date(2026, 1, 1), None, date(1, 1, 1), date(9999, 12, 31)],
                                     pa.date32())}))
    for text in [None, "p IS NULL", "n = 2 OR p LIKE 'x=1%'", "d >= '2026-01-01'"]:
        rel = assert_same(t.scan(filter=text))
        assert "ARROW" not in plan_of(rel)


def test_deletion_vectors_across_schema_versions(sqlite_lake):
    t = sqlite_lake.create_table("s.dv_evolved", PK, primary_key=["id"], buckets=2,
                                 deletion_vectors=True)
    t.upsert({"id": list(range(300)), "p": ["a"] * 300, "v": list(range(300)), "s": [0] * 300})
    t.rename_column("v", "w")
    t.add_column("x", pa.string())
    t.upsert({"id": list(range(0, 300, 4)), "p": ["b"] * 75, "w": [-1] * 75, "s": [1] * 75,
              "x": ["new"] * 75})
    t.upsert({"id": list(range(0, 300, 8)), "p": ["c"] * 38, "w": [-2] * 38, "s": [2] * 38,
              "x": ["newer"] * 38})
    t.delete("id >= 290")
    scan = t.scan()
    assert len({f.schema_id for f in scan.plan()[0].files if f.deletes}) == 2
    for text in [None, "w < 0", "x IS NULL AND id < 100", "p = 'b' OR x = 'newer'"]:
        rel = assert_same(t.scan(filter=text))
        # One Arrow source: the deleted positions; every file is read by DuckDB.
        assert plan_of(rel).count("ARROW_SCAN") <= 1
    assert len(t.scan().to_duckdb().fetchall()) == 290
