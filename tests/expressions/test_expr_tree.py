import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from arrowlake.errors import ValidationError
from arrowlake.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    Column,
    Comparison,
    In,
    IsNotNull,
    IsNull,
    Literal,
    Not,
    Or,
    StartsWith,
    and_all,
    col,
    conjuncts,
    lit,
    or_any,
    parse_filter,
    referenced_columns,
    rename_columns,
)


def test_operators_build_nodes():
    assert (col("x") == 1) == Comparison("=", Column("x"), Literal(1))
    assert (col("x") != 1) == Comparison("!=", Column("x"), Literal(1))
    assert (col("x") < 1).op == "<"
    assert (col("x") <= 1).op == "<="
    assert (col("x") > 1).op == ">"
    assert (col("x") >= 1).op == ">="


def test_reflected_comparisons_put_the_column_left():
    assert (3 < col("x")) == (col("x") > 3)  # noqa: SIM300 - reflection is the point
    assert (3 >= col("x")) == (col("x") <= 3)  # noqa: SIM300
    assert (3 == col("x")) == (col("x") == 3)  # noqa: SIM300
    assert (lit(3) < col("x")) == (col("x") > 3)
    assert (lit(3) == col("x")) == (col("x") == 3)


def test_column_vs_column():
    expr = col("source.ts") > col("target.ts")
    assert expr == Comparison(">", Column("source.ts"), Column("target.ts"))
    assert str(expr) == "source.ts > target.ts"


def test_boolean_combinators():
    a, b = col("a") > 1, col("b") < 2
    assert (a & b) == And(a, b)
    assert (a | b) == Or(a, b)
    assert ~a == Not(a)
    assert (a & True) == a
    assert (a | True) == AlwaysTrue()
    assert (a & False) == AlwaysFalse()
    assert (False | a) == a


def test_predicates_on_columns():
    assert col("x").isin([1, 2]) == In(Column("x"), (1, 2))
    assert col("x").isin(pa.array([1, 2])) == In(Column("x"), (1, 2))
    assert col("x").is_null() == IsNull(Column("x"))
    assert col("x").is_not_null() == IsNotNull(Column("x"))
    assert col("x").not_null() == IsNotNull(Column("x"))
    assert col("s").startswith("ab") == StartsWith(Column("s"), "ab")
    assert col("x").between(1, 5) == (col("x") >= 1) & (col("x") <= 5)


@pytest.mark.parametrize(
    "use",
    [
        lambda e: e and e,
        lambda e: not e,
        lambda e: bool(e),
        lambda e: 1 if e else 0,
    ],
)
def test_truth_value_is_refused(use):
    with pytest.raises(TypeError, match="&"):
        use(col("x") > 1)


def test_chained_comparison_is_refused():
    with pytest.raises(TypeError, match="no truth value"):
        1 < col("x") < 3  # noqa: B015 - Python turns this into `and`


def test_equality_with_none_suggests_is_null():
    with pytest.raises(ValidationError, match="IS NULL"):
        _ = col("x") == None  # noqa: E711
    with pytest.raises(ValidationError, match="IS NOT NULL"):
        _ = col("x") != None  # noqa: E711


def test_literals_are_normalized():
    assert lit(np.int64(3)).value == 3 and type(lit(np.int64(3)).value) is int
    assert lit(pa.scalar(2.5)).value == 2.5
    assert lit(lit(1)).value == 1
    assert col("x").isin([lit(1), np.int64(2), 3]).values == (1, 2, 3)
    with pytest.raises(ValidationError, match="Unsupported literal"):
        lit([1, 2])
    with pytest.raises(ValidationError, match="collection"):
        col("x").isin("abc")
    with pytest.raises(ValidationError, match="str prefix"):
        col("x").startswith(1)  # type: ignore[arg-type]


def test_structural_equality_distinguishes_types():
    assert (col("x") == 1) != (col("x") == True)  # noqa: E712
    assert (col("x") == 1) != (col("x") == 1.0)
    assert hash(col("x") == 1) == hash(col("x") == 1)
    assert len({col("x") == 1, col("x") == 1, col("y") == 1}) == 2


@pytest.mark.parametrize(
    "expr, text",
    [
        (col("x") > 3, "x > 3"),
        (col("name") == "it's", "name = 'it''s'"),
        (col("my col") == 1, '"my col" = 1'),
        (col("and") == 1, '"and" = 1'),
        (col('a"b') == 1, '"a""b" = 1'),
        (col("d") == dt.date(2026, 11, 1), "d = DATE '2026-11-01'"),
        (col("t") == dt.datetime(2026, 11, 1, 10), "t = TIMESTAMP '2026-11-01 10:00:00'"),
        (col("p") == Decimal("1.50"), "p = DECIMAL '1.50'"),
        (col("b") == b"\x00\xff", "b = X'00ff'"),
        (col("f") == True, "f = TRUE"),  # noqa: E712
        (col("x").isin([1, None]), "x IN (1, NULL)"),
        (~col("x").isin([1]), "x NOT IN (1)"),
        (~col("s").startswith("a%_"), "s NOT LIKE 'a\\%\\_%'"),
        ((col("a") == 1) | (col("b") == 2) & (col("c") == 3), "a = 1 OR b = 2 AND c = 3"),
        (((col("a") == 1) | (col("b") == 2)) & (col("c") == 3), "(a = 1 OR b = 2) AND c = 3"),
        (~((col("a") == 1) & (col("b") == 2)), "NOT (a = 1 AND b = 2)"),
        (AlwaysTrue(), "TRUE"),
    ],
)
def test_str_prints_the_filter_syntax(expr, text):
    assert str(expr) == text
    assert repr(expr) == text
    assert parse_filter(text) == expr


def test_repr_of_terms():
    assert repr(col("x")) == "col('x')"
    assert repr(lit(3)) == "lit(3)"


def test_referenced_columns():
    expr = parse_filter("a > 1 AND (b IN (1, 2) OR NOT c IS NULL) AND d > e")
    assert referenced_columns(expr) == {"a", "b", "c", "d", "e"}
    assert referenced_columns(AlwaysTrue()) == set()


def test_rename_columns():
    expr = parse_filter("ts > target.ts AND id IN (1, 2) AND s LIKE 'x%' AND NOT n IS NULL")
    renamed = rename_columns(expr, {"ts": "source.ts", "id": "source.id", "s": "t", "n": "m"})
    assert str(renamed) == (
        "source.ts > target.ts AND source.id IN (1, 2) AND t LIKE 'x%' AND NOT (m IS NULL)"
    )
    assert rename_columns(expr, {}) == expr


def test_and_all_and_conjuncts():
    a, b, c = col("a") > 1, col("b") > 2, (col("c") > 3) | (col("d") > 4)
    assert and_all([]) == AlwaysTrue()
    assert and_all([a]) == a
    assert and_all([a, None, "b > 2", c]) == a & b & c
    assert and_all([a, AlwaysFalse()]) == AlwaysFalse()
    assert conjuncts(a & (b & c)) == [a, b, c]
    assert conjuncts(AlwaysTrue()) == []
    assert conjuncts(c) == [c]
    assert and_all(conjuncts(a & b & c)) == a & b & c
    assert or_any([]) == AlwaysFalse()
    assert or_any([a, b]) == a | b


def test_nodes_are_immutable():
    expr = col("x") > 1
    with pytest.raises(AttributeError):
        expr.op = "<"  # type: ignore[misc]
