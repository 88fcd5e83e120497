"""a09: filters of thousands of terms (what generated queries send) work in every visitor:
parsing, printing, equality, binding, Arrow conversion, evaluation and statistics pruning.
A chain of ANDs or of ORs is one node however long; only alternating nesting is bounded."""

import pickle
import time

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from arrowlake.errors import FilterSyntaxError, ValidationError
from arrowlake.expressions import (
    And,
    Or,
    all_match,
    and_all,
    col,
    conjuncts,
    evaluate,
    may_match,
    or_any,
    parse_filter,
    referenced_columns,
    rename_columns,
    to_arrow,
)
from arrowlake.expressions.tree import MAX_NESTING

N = 10_000
TABLE = pa.table({"a": pa.array(range(2 * N), pa.int64()), "b": pa.array(range(2 * N), pa.int64())})
STATS = pa.table({"row_count": [N, N, 5], "min.a": [0, N, 3 * N], "max.a": [N - 1, 2 * N - 1,
                  4 * N], "nulls.a": [0, 0, 0]})


def ors_by_operators():
    expr = col("a") == 0
    for i in range(1, N):
        expr = expr | (col("a") == i)
    return expr


def check_everywhere(expr, matching):
    """``expr`` selects ``matching`` rows of TABLE by every route, and survives every visitor."""
    text = str(expr)
    assert parse_filter(text) == expr and hash(parse_filter(text)) == hash(expr)
    assert pickle.loads(pickle.dumps(expr)) == expr
    assert evaluate(expr, TABLE).true_count == matching
    assert TABLE.filter(to_arrow(expr, TABLE.schema)).num_rows == matching
    assert ds.dataset(TABLE).to_table(filter=to_arrow(expr, TABLE.schema)).num_rows == matching
    assert referenced_columns(rename_columns(expr, {"a": "z"})) <= {"z", "b"}
    return may_match(expr, STATS, TABLE.schema).to_pylist(), all_match(
        expr, STATS, TABLE.schema).to_pylist()


def test_a09_ten_thousand_ors_through_the_parser():
    expr = parse_filter(" or ".join(f"a = {i}" for i in range(N)))
    assert isinstance(expr, Or) and len(expr.children) == N
    assert check_everywhere(expr, N) == ([True, False, False], [False, False, False])


def test_a09_ten_thousand_ors_through_the_operators():
    expr = ors_by_operators()
    assert expr == parse_filter(" OR ".join(f"a = {i}" for i in range(N))) == or_any(
        col("a") == i for i in range(N))
    assert check_everywhere(expr, N)[0] == [True, False, False]


def test_a09_ten_thousand_ands_through_the_parser_and_the_operators():
    text = " AND ".join(f"a != {i}" for i in range(N))
    expr = col("a") != 0
    for i in range(1, N):
        expr = expr & (col("a") != i)
    assert parse_filter(text) == expr == and_all(col("a") != i for i in range(N))
    assert len(conjuncts(expr)) == N
    assert check_everywhere(expr, N) == ([True, True, True], [False, True, True])


def test_a09_ten_thousand_ors_of_pairs():
    # Composite keys: no IN can replace these, and Arrow flattens such a chain and walks it
    # recursively in C++ (a segfault at about 8,000 operands) unless it is split.
    expr = parse_filter(" OR ".join(f"(a = {i} AND b >= {i})" for i in range(N)))
    assert evaluate(expr, TABLE).true_count == N
    assert ds.dataset(TABLE).to_table(filter=to_arrow(expr, TABLE.schema)).num_rows == N
    assert may_match(expr, STATS, TABLE.schema).to_pylist() == [True, False, False]
    expr = parse_filter(" AND ".join(f"(a != {i} OR b < 0)" for i in range(N)))
    assert ds.dataset(TABLE).to_table(filter=to_arrow(expr, TABLE.schema)).num_rows == N


def test_a09_deep_parentheses_parse():
    depth = 10_000
    assert parse_filter("(" * depth + "a = 1" + ")" * depth) == (col("a") == 1)
    # Same-kind nesting is absorbed however it is written.
    right_deep = "a = 0" + "".join(f" OR (a = {i}" for i in range(1, N)) + ")" * (N - 1)
    assert parse_filter(right_deep) == ors_by_operators()
    with pytest.raises(FilterSyntaxError, match="Expected '\\)' to close the '\\(' opened at "
                                                "position 0"):
        parse_filter("((" + "(" * depth + "a = 1" + ")" * depth + ")")


def test_a09_nesting_past_the_limit_is_a_clear_error():
    ok = col("a") == 0
    for i in range(MAX_NESTING - 1):  # each alternation nests one level deeper
        ok = (ok & (col("b") == i)) if i % 2 else (ok | (col("a") == i))
    assert parse_filter(str(ok)) == ok
    assert evaluate(ok, TABLE) is not None
    with pytest.raises(ValidationError, match=f"more than {MAX_NESTING} levels deep"):
        ~ok  # noqa: B018
    with pytest.raises(ValidationError, match="levels deep"):
        expr = col("a") == 0
        for i in range(N):
            expr = (expr | (col("a") == i)) & (col("b") == i)
    with pytest.raises(FilterSyntaxError, match="levels deep") as info:
        parse_filter("NOT " * N + "a = 1")
    assert info.value.position == 4 * (N - MAX_NESTING)
    alternating = "".join(f"a = {i} {'AND' if i % 2 else 'OR'} (" for i in range(N))
    with pytest.raises(FilterSyntaxError, match="levels deep"):
        parse_filter(alternating + "a = 1" + ")" * N)


def test_a09_n_ary_nodes_keep_the_binary_view():
    a, b, c = (col(n) == 1 for n in "abc")
    assert And(And(a, b), c) == And(a, And(b, c)) == And(a, b, c)
    assert And(a, b, c).left == And(a, b) and And(a, b, c).right == c
    assert str(Or(And(a, b), c)) == "a = 1 AND b = 1 OR c = 1"
    assert str(And(Or(a, b), c)) == "(a = 1 OR b = 1) AND c = 1"
    with pytest.raises(TypeError, match="two operands"):
        And(a)


def test_long_in_lists_are_fast():
    values = list(range(100_000))
    start = time.perf_counter()
    expr = col("a").isin(values)
    assert evaluate(expr, TABLE).true_count == 2 * N
    assert TABLE.filter(to_arrow(expr, TABLE.schema)).num_rows == 2 * N
    assert may_match(expr, STATS, TABLE.schema).to_pylist() == [True, True, True]
    assert parse_filter(str(expr)) == expr
    assert time.perf_counter() - start < 10  # about 1 s; minutes when each value was a call
