"""One filter, one set of rows: ``arrowlake.spark.read(..., filter=)`` returns exactly what
``scan(filter=)`` returns (docs/architecture.md, "Values"), although Spark orders NaN above
every number, makes NaN equal to itself, and prunes row groups by statistics that leave NaN
out. Every filter of a test is read in one Spark job (a union of the filtered reads), so the
list can be long."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

from pyspark.sql import functions as F

import arrowlake.spark as als

NAN, INF = float("nan"), float("inf")
FLOATS = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.float32()),
                    ("z", pa.float64()), ("i", pa.int64())])
# Two rows a row group: groups such as [1.0, NaN] or [0.5, NaN], whose statistics (NaN left
# out) would let a pushed-down `x != 1` or `NOT (x < 1)` drop the NaN row.
X = [1.0, NAN, 0.5, NAN, -0.0, -0.0, 0.0, 0.0, INF, NAN, None, NAN, 2.0, 3.0, -INF, -1.5,
     None, None, 1.0, 1.0]
Z = [1.0, NAN, 2.0, 0.0, 0.0, NAN, -0.0, None, INF, 1.0, 1.0, NAN, 2.0, -3.0, -INF, -1.5,
     None, 0.0, NAN, 1.0]

#: Through arrowlake.spark.read(filter=) itself (each is a Spark read of its own).
READ_FILTERS = ["x > 1", "x >= 2", "x > 0", "x in (1.0, 'NaN')", "x != 1", "not (x < 1)"]
#: Through the condition plan_read gives Spark, on one read of the table's files: the same
#: `where` that arrowlake.spark.read(filter=) adds, pushed into the scan the same way.
FLOAT_FILTERS = [
    # every comparison against numbers, zeros and infinities, and negated
    "x < 1", "x <= 0", "x = 0", "x = -0.0", "x != 0", "x > -0.0", "x < 'inf'",
    "x >= '-inf'", "x = 'inf'", "not (x >= 2)", "not (x <= 0.5)", "not (x = 1)",
    "not (x != 1)", "not (x between 0 and 2)",
    # NaN literals
    "x = 'NaN'", "x != 'NaN'", "x > 'NaN'", "not (x = 'NaN')", "not (x != 'NaN')",
    "not (x < 'NaN')",
    # IN and NOT IN (past 10 values Spark hashes the list)
    "x in (0.0)", "x in (-0.0, 5)", "x in ('NaN')", "x not in (1.0)", "x not in ('NaN')",
    "x not in (1.0, NULL)", "x in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)",
    "x not in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)", "x != 0 and x != 1 and x != 'NaN'",
    # float32, and a float32 column against float64 literals
    "y > 1", "y != 1", "not (y < 1)", "y in (0.5, 'NaN')", "y > 0.1",
    # columns against columns
    "x > z", "x = z", "x != z", "not (x < z)", "y = x",
    # nulls, and mixtures
    "x is null", "not (x > 1 or z < 0)", "i > 2.5", "not (i < 10 and x >= 0)",
]


@pytest.fixture(scope="module")
def floats(tmp_path_factory):
    path = tmp_path_factory.mktemp("filters") / "lake"
    lake = al.connect(path)
    t = lake.create_table("s.f", FLOATS, properties={"write.row-group-rows": "2"})
    n = len(X)
    t.append(pa.table({"id": list(range(n)), "x": X,
                       "y": pa.array([None if v is None else v for v in X], pa.float32()),
                       "z": Z, "i": list(range(n))}, schema=FLOATS))
    return path, lake, t


def read_ids(spark, lake, table: str, filters: list[str]) -> list[list[int]]:
    """The ids ``arrowlake.spark.read(filter=f)`` returns for each of ``filters``: one job."""
    frames = [als.read(spark, lake, table, filter=f, columns=["id"])
              .select(F.lit(k).alias("k"), "id") for k, f in enumerate(filters)]
    return _ids(reduce(lambda a, b: a.unionByName(b), frames), len(filters))


def condition_ids(spark, lake, table: str, filters: list[str]) -> list[list[int]]:
    """The ids each filter's Spark condition keeps from one fast read of the table: one job."""
    base = als.read(spark, lake, table)
    conditions = [als.plan_read(spark, lake, table, filter=f).condition for f in filters]
    assert all(conditions), dict(zip(filters, conditions, strict=True))
    frames = [base.where(c).select(F.lit(k).alias("k"), "id")
              for k, c in enumerate(conditions)]
    return _ids(reduce(lambda a, b: a.unionByName(b), frames), len(filters))


def _ids(frame, n: int) -> list[list[int]]:
    found: list[list[int]] = [[] for _ in range(n)]
    for row in frame.collect():
        found[row["k"]].append(row["id"])
    return [sorted(ids) for ids in found]


def scan_ids(table, filters: list[str]) -> list[list[int]]:
    return [sorted(table.scan(filter=f, columns=["id"]).to_arrow()["id"].to_pylist())
            for f in filters]


def differences(filters, got, expected) -> dict:
    return {f: (g, e) for f, g, e in zip(filters, got, expected, strict=True) if g != e}


def test_the_fast_path_returns_the_rows_of_scan_for_every_float_filter(spark, floats):
    _, lake, t = floats
    for f in READ_FILTERS:  # all read by Spark's own reader
        plan = als.plan_read(spark, lake, "s.f", filter=f)
        assert plan.condition is not None and not plan.source, plan.describe()
    expected = scan_ids(t, READ_FILTERS)
    assert expected[0] == [8, 12, 13]  # x > 1: no NaN row (1, 3, 9, 11)
    assert differences(READ_FILTERS, read_ids(spark, lake, "s.f", READ_FILTERS),
                       expected) == {}
    assert differences(FLOAT_FILTERS, condition_ids(spark, lake, "s.f", FLOAT_FILTERS),
                       scan_ids(t, FLOAT_FILTERS)) == {}


def test_the_format_option_returns_the_same_rows(spark, floats):
    path, _, t = floats
    for f in ("x > 1", "x in (1.0, 'NaN')"):  # the data source applies arrowlake's filter
        rows = (spark.read.format("arrowlake").option("lake", str(path)).option("filter", f)
                .load("s.f").select("id").collect())
        assert sorted(r["id"] for r in rows) == scan_ids(t, [f])[0], f


OTHER = pa.schema([("id", pa.int64()), ("s", pa.string()), ("b", pa.binary()),
                   ("d", pa.date32()), ("tz", pa.timestamp("us", tz="UTC")),
                   ("ntz", pa.timestamp("ms")), ("dec", pa.decimal128(12, 3)),
                   ("u", pa.uint64()), ("flag", pa.bool_())])


def test_literals_mean_the_same_whatever_the_session_time_zone(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.o", OTHER)
    t.append(pa.table({
        "id": [0, 1, 2, 3, 4],
        "s": ["it's", "a\\b", "plain", None, "ünï"],
        "b": [b"\x00'", b"\\", b"x", None, b""],
        "d": [date(2026, 11, 1), date(1, 1, 1), date(9999, 12, 31), None, date(1970, 1, 1)],
        "tz": [datetime(2026, 3, 29, 1, 30, tzinfo=UTC), None,
               datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
               datetime(2026, 3, 29, 2, 30, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)],
        "ntz": [datetime(2026, 3, 29, 1, 30), None, datetime(2026, 10, 25, 2, 30, 0, 5000),
                datetime(1900, 1, 1), datetime(2026, 3, 29, 2, 30)],
        "dec": [Decimal("12345678.901"), Decimal("-0.001"), None, Decimal("0.000"),
                Decimal("999999999.999")],
        "u": [2**64 - 1, 0, None, 2**63, 7],
        "flag": [True, False, None, True, False],
    }, schema=OTHER))
    filters = [
        "s = 'it''s'", "s = 'a\\b'", "s >= 'plain'", "s like 'ü%'", "s != 'plain'",
        "b = 'x'", "b < 'x'", "d < '1970-01-02'", "d = '0001-01-01'", "d >= '9999-12-31'",
        "tz > '2026-03-29T01:00:00'", "tz <= '1969-12-31T23:59:59.999999+00:00'",
        "tz = '0001-01-01T00:00:00Z'", "ntz = '2026-03-29T02:30:00'",
        "ntz > '2026-10-25T02:30:00.004'", "ntz < '1900-01-01T00:00:00.001'",
        "dec > 0", "dec = 0", "dec < '-0.0005'", "dec in (12345678.901, 0)",
        "u > 9223372036854775807", "u = 18446744073709551615", "u < 8", "flag", "not flag",
        "flag = false", "flag is null",
    ]
    key = "spark.sql.session.timeZone"
    before = spark.conf.get(key)
    spark.conf.set(key, "America/New_York")  # naive literals are UTC for arrowlake
    try:
        got = condition_ids(spark, lake, "s.o", filters)
    finally:
        spark.conf.set(key, before)
    assert differences(filters, got, scan_ids(t, filters)) == {}


def test_a_filter_spark_cannot_compare_exactly_is_applied_by_arrowlakes_reader(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", pa.schema([("id", pa.int64()),
                                            ("ts", pa.timestamp("us"))]))
    t.append({"id": [0, 1], "ts": [datetime(2026, 1, 1), datetime(2026, 1, 1, 0, 0, 0, 1)]})
    # A nanosecond literal: Spark's timestamps stop at microseconds.
    f = al.col("ts") > pa.scalar(1_767_225_600_000_000_500, pa.timestamp("ns"))
    plan = als.plan_read(spark, lake, "s.t", filter=f)
    assert plan.condition is None and not plan.parquet and plan.source
    assert "cannot evaluate exactly" in plan.describe()
    rows = als.read(spark, lake, "s.t", filter=f).collect()
    assert [r["id"] for r in rows] == [1] == t.scan(filter=f).to_arrow()["id"].to_pylist()


def test_on_deletion_vector_files_the_filter_runs_before_the_deleted_row_check(spark, tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.dv", FLOATS, primary_key=["id"], buckets=2, deletion_vectors=True,
                          properties={"write.row-group-rows": "2"})
    n = len(X)
    t.upsert(pa.table({"id": list(range(n)), "x": X, "y": pa.array(X, pa.float32()), "z": Z,
                       "i": list(range(n))}, schema=FLOATS))
    t.upsert(pa.table({"id": [1, 2, 8], "x": [NAN, 5.0, None], "y": pa.array([1.0, 2.0, 3.0],
                       pa.float32()), "z": [0.0, 0.0, 0.0], "i": [1, 2, 8]}, schema=FLOATS))
    t.delete("id in (3, 12)")
    assert any(g.deletes is not None for g in als.plan_read(spark, lake, "s.dv").parquet)
    assert differences(READ_FILTERS, read_ids(spark, lake, "s.dv", READ_FILTERS),
                       scan_ids(t, READ_FILTERS)) == {}
    plan = als.read(spark, lake, "s.dv", filter="x > 1")._jdf.queryExecution() \
        .executedPlan().toString()
    # One Filter: the read's condition first, then the check of the deleted positions.
    [line] = [ln for ln in plan.splitlines() if re.search(r"\) Filter \(", ln) and "isnan" in ln]
    assert "file_size" in line and line.index("isnan") < line.index("file_size"), plan
