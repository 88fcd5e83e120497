import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from arrowlake.errors import ColumnNotFound, ValidationError
from arrowlake.expressions import col, evaluate, parse_filter, to_arrow

UTC = dt.UTC


def rows(table: pa.Table, filter) -> list:
    """Ids of the rows selected, through both the Expression and the mask."""
    mask = evaluate(filter, table)
    by_mask = table.column("id").filter(mask).to_pylist()
    # pyarrow cannot filter tables holding string_view columns; the Expression is checked on
    # the other columns through a projection, which evaluates it the same way.
    expression = to_arrow(filter, table.schema)
    projected = ds.dataset(table).to_table(columns={"id": pc.field("id"), "m": expression})
    by_expression = projected.filter(pc.field("m")).column("id").to_pylist()
    assert by_mask == by_expression
    return by_mask


@pytest.fixture
def table() -> pa.Table:
    return pa.table(
        {
            "id": [0, 1, 2, 3],
            "i": pa.array([1, 2, None, 4], pa.int32()),
            "u8": pa.array([1, 2, 3, 255], pa.uint8()),
            "f": [1.5, float("nan"), None, 4.0],
            "f32": pa.array([0.1, 0.2, None, 0.4], pa.float32()),
            "dec": pa.array(
                [Decimal("1.10"), Decimal("2.25"), None, Decimal("9.99")], pa.decimal128(5, 2)
            ),
            "s": ["apple", "banana", None, "apricot"],
            "ls": pa.array(["apple", "banana", None, "apricot"], pa.large_string()),
            "sv": pa.array(["apple", "banana", None, "apricot"], pa.string_view()),
            "dict": pa.array(["apple", "banana", None, "apricot"]).dictionary_encode(),
            "bin": pa.array([b"\x00", b"\x01", None, b"\x02"]),
            "d": pa.array([dt.date(2026, 1, 1), dt.date(2026, 11, 1), None, dt.date(2027, 1, 1)]),
            "b": [True, False, None, True],
        }
    )


@pytest.mark.parametrize(
    "filter, expected",
    [
        ("i > 1", [1, 3]),
        ("i >= 2 AND i <= 3", [1]),
        ("i > 1.5", [1, 3]),  # a fractional literal compares the int column as float
        ("i = 2.0", [1]),
        ("i = '2'", [1]),  # numeric strings are numbers for numeric columns
        ("i IN (1, 2.5, 4)", [0, 3]),
        ("i NOT IN (1)", [1, 3]),  # NOT IN never selects a null
        ("i IN (1, NULL)", [0]),
        ("i NOT IN (1, NULL)", []),  # SQL: NOT IN with a NULL in the list is never true
        ("NOT i > 1", [0]),
        ("i IS NULL", [2]),
        ("i IS NOT NULL", [0, 1, 3]),
        ("u8 < 1000", [0, 1, 2, 3]),  # out of the column's range, still compared exactly
        ("u8 > -1", [0, 1, 2, 3]),
        ("u8 = 255", [3]),
        ("u8 IN (1, 1000)", [0]),
        ("f > 1", [0, 3]),
        ("f != 1.5", [1, 3]),  # NaN != 1.5
        ("NOT f < 2", [1, 3]),  # NOT (NaN < 2) is true
        ("f = 4", [3]),
        ("f32 = 0.2", [1]),  # the literal is rounded like the column
        ("dec > 2.2", [1, 3]),
        ("dec = '2.25'", [1]),
        ("dec = DECIMAL '2.250'", [1]),
        ("dec > 2.255", [3]),  # more decimals than the column: compared in a wider decimal
        ("dec < 100000", [0, 1, 3]),  # more integer digits than the column
        ("dec IN (1.1, 9.99)", [0, 3]),
        ("s = 'apple'", [0]),
        ("s > 'b'", [1]),
        ("s LIKE 'ap%'", [0, 3]),
        ("s NOT LIKE 'ap%'", [1]),
        ("s IN ('apple', 'banana')", [0, 1]),
        ("ls LIKE 'ap%'", [0, 3]),
        ("ls = 'banana'", [1]),
        ("sv = 'banana'", [1]),
        ("sv >= 'apricot'", [1, 3]),
        ("sv LIKE 'ap%'", [0, 3]),
        ("sv IN ('apple', 'x')", [0]),
        ("sv NOT IN ('apple')", [1, 3]),
        ("dict = 'apple'", [0]),
        ("dict < 'b'", [0, 3]),
        ("dict LIKE 'ap%'", [0, 3]),
        ("dict IN ('apricot', 'zzz')", [3]),
        ("bin = X'01'", [1]),
        ("bin > X'00'", [1, 3]),
        ("d >= '2026-11-01'", [1, 3]),
        ("d = DATE '2026-11-01'", [1]),
        ("d < TIMESTAMP '2026-11-01 00:00:00'", [0]),
        ("d BETWEEN '2026-01-01' AND '2026-12-31'", [0, 1]),
        ("b", [0, 3]),
        ("NOT b", [1]),
        ("b = FALSE", [1]),
        ("TRUE", [0, 1, 2, 3]),
        ("FALSE", []),
        ("s = ls", [0, 1, 3]),
        ("sv = s", [0, 1, 3]),
        ("dict = s", [0, 1, 3]),
        ("i < f", [0]),
        ("(i > 1 OR s = 'apple') AND NOT d IS NULL", [0, 1, 3]),
    ],
)
def test_filters_select_rows(table, filter, expected):
    assert rows(table, filter) == expected


def test_python_literals(table):
    assert rows(table, col("d") >= dt.date(2026, 11, 1)) == [1, 3]
    assert rows(table, col("d") == dt.datetime(2026, 11, 1)) == [1]
    assert rows(table, col("dec") == Decimal("2.25")) == [1]
    assert rows(table, col("dec") == 2.25) == [1]
    assert rows(table, col("dec") == 1.1) == [0]  # 1.1 means 1.1, not its binary expansion
    assert rows(table, col("dec") > 2) == [1, 3]
    assert rows(table, col("i").isin(pa.array([2, 4]))) == [1, 3]
    assert rows(table, col("bin") == "\x01") == [1]


UNITS = ["s", "ms", "us", "ns"]
TIMES = [
    dt.datetime(2026, 11, 1, 9, 59, 59),
    dt.datetime(2026, 11, 1, 10, 0, 0),
    None,
    dt.datetime(2026, 11, 1, 10, 0, 1),
]


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Paris"])
def test_timestamps_of_every_unit_and_zone(unit, tz):
    # Values are UTC instants for zoned columns and wall-clock times for naive ones.
    values = pa.array(
        [t.replace(tzinfo=UTC) if t and tz else t for t in TIMES], pa.timestamp(unit, tz)
    )
    table = pa.table({"id": [0, 1, 2, 3], "t": values})
    assert rows(table, "t >= '2026-11-01 10:00:00'") == [1, 3]
    assert rows(table, "t >= TIMESTAMP '2026-11-01 10:00:00'") == [1, 3]
    assert rows(table, "t > '2026-11-01T10:00:00.5'") == [3]  # finer than the column
    assert rows(table, "t < '2026-11-01 10:00:00.000001'") == [0, 1]
    assert rows(table, col("t") == dt.datetime(2026, 11, 1, 10)) == [1]
    # An aware literal is an instant: 11:00 in Paris (+01:00 in November) is 10:00 UTC.
    paris = dt.timezone(dt.timedelta(hours=1))
    assert rows(table, col("t") == dt.datetime(2026, 11, 1, 11, tzinfo=paris)) == [1]
    assert rows(table, "t = TIMESTAMP '2026-11-01 11:00:00+01:00'") == [1]
    assert rows(table, "t >= DATE '2026-11-02'") == []
    assert rows(table, "t < TIMESTAMP '2500-01-01 00:00:00'") == [0, 1, 3]
    assert rows(table, "t IN ('2026-11-01 10:00:00', '2026-11-01 10:00:01')") == [1, 3]


def test_naive_literal_on_zoned_column_is_utc():
    table = pa.table(
        {
            "id": [0],
            "t": pa.array(
                [dt.datetime(2026, 11, 1, 10, tzinfo=UTC)], pa.timestamp("us", "America/New_York")
            ),
        }
    )
    assert rows(table, "t = '2026-11-01 10:00:00'") == [0]
    assert rows(table, "t = '2026-11-01 05:00:00-05:00'") == [0]


def test_empty_in_lists(table):
    assert rows(table, col("i").isin([])) == []
    assert rows(table, ~col("i").isin([])) == [0, 1, 2, 3]
    assert rows(table, col("i").isin([None])) == []
    assert rows(table, ~col("i").isin([None])) == []


def test_column_not_found_lists_the_columns(table):
    with pytest.raises(ColumnNotFound, match="'nope'") as info:
        to_arrow("nope = 1", table.schema)
    assert "available columns: id, i, u8" in str(info.value)
    with pytest.raises(ColumnNotFound):
        evaluate(col("a") > col("nope"), table)


@pytest.mark.parametrize(
    "filter, message",
    [
        ("i = 'abc'", "column 'i' of type int32 with 'abc'"),
        ("i = TRUE", "not a number"),
        ("f = 'x'", "not a number"),
        ("dec = 'x'", "not a number"),
        ("dec = DOUBLE 'nan'", "NaN"),
        ("s = 3", "quote the value"),
        ("b = 1", "TRUE or FALSE"),
        ("d = 'tomorrow'", "ISO date"),
        ("d = TIMESTAMP '2026-01-01 10:00:00'", "time of day"),
        ("d = 3", "column 'd' of type date32[day]"),
        ("bin = 3", "bytes"),
        ("i LIKE 'a%'", "string column"),
        ("i IN (1, 'x')", "'x'"),
        ("i < s", "Cannot compare column 'i' (int32) with column 's' (string)"),
    ],
)
def test_literals_that_do_not_fit_are_validation_errors(table, filter, message):
    with pytest.raises(
        ValidationError,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        to_arrow(filter, table.schema)


def test_timestamp_string_that_is_not_a_timestamp():
    schema = pa.schema({"t": pa.timestamp("us")})
    with pytest.raises(ValidationError, match="ISO timestamp"):
        to_arrow("t > 'noon'", schema)


def test_comparing_with_null_suggests_is_null():
    with pytest.raises(ValidationError, match="IS NULL"):
        to_arrow("x = NULL", pa.schema({"x": pa.int64()}))


def test_to_arrow_returns_an_expression_usable_by_pyarrow(table):
    expr = to_arrow("i > 1 AND s LIKE 'b%'", table.schema)
    assert isinstance(expr, pc.Expression)
    assert table.drop_columns(["sv"]).filter(expr).column("id").to_pylist() == [1]
    assert str(to_arrow(None, table.schema)) == "true"


def test_evaluate_on_batches_and_empty_tables(table):
    batch = table.to_batches()[0]
    assert evaluate("i > 1", batch).to_pylist() == [False, True, False, True]
    empty = table.slice(0, 0)
    assert evaluate("i > 1", empty).to_pylist() == []
    assert evaluate(None, empty).to_pylist() == []
    assert evaluate(None, table).to_pylist() == [True] * 4
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    mask = evaluate("i > 1", chunked)
    assert isinstance(mask, pa.BooleanArray)
    assert mask.to_pylist() == [False, True, False, True]
    assert mask.null_count == 0


def test_delete_keeps_rows_where_the_filter_is_null(table):
    keep = pc.invert(evaluate("i > 1", table))
    assert table.column("id").filter(keep).to_pylist() == [0, 2]


def test_parsed_and_built_filters_agree(table):
    built = (col("i") > 1) | col("s").startswith("ap") & ~col("d").is_null()
    parsed = parse_filter("i > 1 OR s LIKE 'ap%' AND NOT d IS NULL")
    assert built == parsed
    assert rows(table, built) == rows(table, parsed)
