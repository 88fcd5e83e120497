import datetime as dt
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.errors import FilterSyntaxError, ValidationError
from arrowlake.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    Expr,
    col,
    parse_filter,
    to_expression,
)
from tests.expressions.strategies import boolean_trees


@pytest.mark.parametrize(
    "text, expected",
    [
        ("x > 3", col("x") > 3),
        ("x = 3", col("x") == 3),
        ("x == 3", col("x") == 3),
        ("x != 3", col("x") != 3),
        ("x <> 3", col("x") != 3),
        ("x < 3", col("x") < 3),
        ("x <= 3", col("x") <= 3),
        ("x >= -3", col("x") >= -3),
        ("x > -2.5e3", col("x") > -2500.0),
        ("x > .5", col("x") > 0.5),
        ("3 < x", col("x") > 3),
        ("'a' = s", col("s") == "a"),
        ("s = 'it''s'", col("s") == "it's"),
        ("s = ''", col("s") == ""),
        ("b = TRUE", col("b") == True),  # noqa: E712
        ("b = false", col("b") == False),  # noqa: E712
        ("d = DATE '2026-11-01'", col("d") == dt.date(2026, 11, 1)),
        ("t = TIMESTAMP '2026-11-01 10:00:00'", col("t") == dt.datetime(2026, 11, 1, 10)),
        (
            "t = timestamp '2026-11-01T10:00:00.250+02:00'",
            col("t")
            == dt.datetime(
                2026, 11, 1, 10, 0, 0, 250000, tzinfo=dt.timezone(dt.timedelta(hours=2))
            ),
        ),
        (
            "t = TIMESTAMP '2026-11-01 10:00:00Z'",
            col("t") == dt.datetime(2026, 11, 1, 10, tzinfo=dt.UTC),
        ),
        ("p = DECIMAL '1.50'", col("p") == Decimal("1.50")),
        ("b = X'00ff'", col("b") == b"\x00\xff"),
        ("date = DATE '2026-01-01'", col("date") == dt.date(2026, 1, 1)),
        ("timestamp > 3", col("timestamp") > 3),
        ("source.ts > target.ts", col("source.ts") > col("target.ts")),
        ('"source"."ts" > `target`.ts', col("source.ts") > col("target.ts")),
        ('"my col" = 1', col("my col") == 1),
        ('"a""b" = 1', col('a"b') == 1),
        ("x IN (1, 2, 3)", col("x").isin([1, 2, 3])),
        ("x in (1)", col("x").isin([1])),
        ("x IN ('a', NULL)", col("x").isin(["a", None])),
        ("x NOT IN (1, 2)", ~col("x").isin([1, 2])),
        ("x IS NULL", col("x").is_null()),
        ("x is not null", col("x").is_not_null()),
        ("x BETWEEN 1 AND 5", col("x").between(1, 5)),
        ("x NOT BETWEEN 1 AND 5", ~col("x").between(1, 5)),
        ("s LIKE 'ab%'", col("s").startswith("ab")),
        ("s LIKE 'ab%%'", col("s").startswith("ab")),
        ("s LIKE '%'", col("s").startswith("")),
        ("s LIKE 'a\\%b%'", col("s").startswith("a%b")),
        ("s LIKE 'a\\_b\\\\%'", col("s").startswith("a_b\\")),
        ("s LIKE 'abc'", col("s") == "abc"),
        ("s NOT LIKE 'ab%'", ~col("s").startswith("ab")),
        ("active", col("active") == True),  # noqa: E712
        ("NOT active", ~(col("active") == True)),  # noqa: E712
        ("TRUE", AlwaysTrue()),
        ("FALSE", AlwaysFalse()),
        ("1 = 1", AlwaysTrue()),
        ("1 > 2", AlwaysFalse()),
        ("(((x = 1)))", col("x") == 1),
    ],
)
def test_parses(text, expected):
    assert parse_filter(text) == expected


def test_precedence_not_and_or():
    a, b, c = col("a") == 1, col("b") == 2, col("c") == 3
    assert parse_filter("a = 1 OR b = 2 AND c = 3") == a | (b & c)
    assert parse_filter("a = 1 AND b = 2 OR c = 3") == (a & b) | c
    assert parse_filter("NOT a = 1 AND b = 2") == (~a) & b
    assert parse_filter("NOT (a = 1 AND b = 2)") == ~(a & b)
    assert parse_filter("NOT NOT a = 1") == ~~a
    assert parse_filter("(a = 1 OR b = 2) AND c = 3") == (a | b) & c
    assert parse_filter("a = 1 and b = 2 and c = 3") == (a & b) & c
    assert parse_filter("x BETWEEN 1 AND 5 AND y = 2") == col("x").between(1, 5) & (col("y") == 2)


def test_keywords_are_case_insensitive():
    assert parse_filter("x iS nOt NuLl aNd y NoT iN (1) oR z LiKe 'a%'") == (
        col("x").is_not_null() & ~col("y").isin([1]) | col("z").startswith("a")
    )


def test_round_trip_of_a_complex_filter():
    text = (
        "(a >= 1 OR NOT (b IN ('x', 'y'))) AND c IS NOT NULL AND d < DATE '2026-11-01' "
        "AND \"e f\" LIKE 'p%' AND g NOT IN (1.5, -2) AND h = X'0a' AND i != j"
    )
    expr = parse_filter(text)
    assert parse_filter(str(expr)) == expr


@pytest.mark.parametrize(
    "text, position, message",
    [
        ("", 0, "empty"),
        ("   ", 0, "empty"),
        ("x >", 3, "Expected a value after '>'"),
        ("x > AND y = 1", 4, "Expected a value after '>'"),
        ("x = 'abc", 4, "Unterminated string"),
        ('"abc = 1', 0, "Unterminated quoted identifier"),
        ("x $ 3", 2, "Unexpected character '$'"),
        ("x = 3abc", 5, "Unexpected character 'a'"),
        ("x = 1 y = 2", 6, "Unexpected 'y'"),
        ("(x = 1", 6, "Expected ')'"),
        ("x = 1)", 5, "Unmatched ')'"),
        ("()", 1, "Expected a condition"),
        ("x = 1 AND", 9, "Expected a condition"),
        ("x IN ()", 6, "at least one value"),
        ("x IN (1, 2", 10, "Expected ',' or ')'"),
        ("x IN 1", 5, "Expected '('"),
        ("x IN (y)", 6, "Expected a value in the IN list"),
        ("x = NULL", 4, "IS NULL"),
        ("x != NULL", 5, "IS NOT NULL"),
        ("NULL = x", 0, "IS NULL"),
        ("s LIKE '%a'", 7, "only prefix patterns"),
        ("s LIKE 'a_b%'", 7, "only prefix patterns"),
        ("s LIKE 'a%b'", 7, "only prefix patterns"),
        ("s LIKE x", 7, "quoted pattern"),
        ("x BETWEEN 1", 11, "Expected AND"),
        ("x IS 3", 5, "Expected NULL"),
        ("d = DATE '2026-13-01'", 9, "Invalid DATE literal"),
        ("t = TIMESTAMP 'yesterday'", 14, "Invalid TIMESTAMP literal"),
        ("x = - 'a'", 6, "Expected a number after '-'"),
        ("3", 1, "Expected a comparison after '3'"),
        ("'a' = 1", 0, "needs a column"),
        ("1 IN (1)", 0, "Expected a column before IN"),
        ("x.", 2, "Expected a name after the '.'"),
        ("b = X'0g'", 4, "Invalid hex"),
    ],
)
def test_syntax_errors_point_at_the_token(text, position, message):
    with pytest.raises(FilterSyntaxError, match=re.escape(message)) as info:
        parse_filter(text)
    assert info.value.position == position
    assert info.value.text == text
    assert f"position {position}" in str(info.value) or position == 0
    # The message ends with the filter and a caret under the offending token.
    if text:
        lines = str(info.value).splitlines()
        assert lines[-1].index("^") - 2 == position


def test_syntax_errors_are_validation_errors():
    with pytest.raises(ValidationError):
        parse_filter("x >")


def test_to_expression():
    assert to_expression(None) == AlwaysTrue()
    assert to_expression("x = 1") == (col("x") == 1)
    expr = col("x") > 1
    assert to_expression(expr) is expr
    with pytest.raises(ValidationError, match="must be an expression"):
        to_expression(3)  # type: ignore[arg-type]


# -- property: printing and parsing are inverse ---------------------------------------------

names = st.sampled_from(["a", "b.c", "my col", "and", "Date", 'q"uote'])
values = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.dates(),
    st.datetimes(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.binary(max_size=4),
)


def leaves() -> st.SearchStrategy[Expr]:
    column = names.map(col)
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])

    def compare(c, op, v):
        return {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}[op]

    return st.one_of(
        st.builds(compare, column, ops, values),
        st.builds(compare, column, ops, column),
        st.builds(
            lambda c, vs: c.isin(vs), column, st.lists(values | st.none(), min_size=1, max_size=3)
        ),
        st.builds(lambda c: c.is_null(), column),
        st.builds(lambda c: c.is_not_null(), column),
        st.builds(lambda c, p: c.startswith(p), column, st.text(max_size=4)),
    )


filters = boolean_trees(leaves())


@settings(max_examples=300, deadline=None)
@given(filters)
def test_str_parses_back_to_the_same_tree(expr):
    assert parse_filter(str(expr)) == expr
