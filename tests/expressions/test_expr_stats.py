import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowlake.errors import ColumnNotFound
from arrowlake.expressions import Expr, all_match, col, evaluate, lit, may_match
from arrowlake.expressions.stats import IN_LIST_PER_VALUE_LIMIT
from arrowlake.io.stats import column_stats, merge_stats, stats_table
from arrowlake.schema import FIELD_ID_KEY


def file_stats(files: list[pa.Table], drop: frozenset[tuple[int, str]] = frozenset()) -> pa.Table:
    """The statistics table of ``files``, as the writer computes, stores and planning decodes
    it (two-row chunks merged, as row groups are); ``drop`` makes the (file, column)
    statistics unknown."""
    schema = pa.schema([f.with_metadata({FIELD_ID_KEY: str(i + 1)})
                        for i, f in enumerate(files[0].schema)])
    texts = []
    for k, f in enumerate(files):
        f = pa.Table.from_arrays(f.columns, schema=schema)
        chunks = [f.slice(i, 2) for i in range(0, f.num_rows, 2)] or [f]
        stats = merge_stats([(column_stats(c, schema), c.num_rows) for c in chunks], schema)
        for i, field in enumerate(schema):
            if (k, field.name) in drop:
                stats[str(i + 1)] = [None] * len(stats[str(i + 1)])
        texts.append(json.dumps(stats))
    return stats_table(texts, pa.array([f.num_rows for f in files], pa.int64()), schema,
                       schema.names)


SCHEMA = pa.schema({"x": pa.int64(), "s": pa.string()})


@pytest.fixture
def stats() -> pa.Table:
    # file 0: x in [0, 10], no nulls        s in ['apple', 'apricot']
    # file 1: x in [20, 30], 2 nulls of 5    s in ['banana', 'cherry'], 1 null
    # file 2: x all null (3 rows)           s unknown
    # file 3: x unknown                      s = 'kiwi' everywhere
    # file 4: empty
    return pa.table(
        {
            "row_count": pa.array([5, 5, 3, 4, 0], pa.int64()),
            "min.x": pa.array([0, 20, None, None, None], pa.int64()),
            "max.x": pa.array([10, 30, None, None, None], pa.int64()),
            "nulls.x": pa.array([0, 2, 3, None, 0], pa.int64()),
            "min.s": ["apple", "banana", None, "kiwi", None],
            "max.s": ["apricot", "cherry", None, "kiwi", None],
            "nulls.s": pa.array([0, 1, None, 0, 0], pa.int64()),
        }
    )


def may(filter, stats, schema=SCHEMA) -> list[bool]:
    return may_match(filter, stats, schema).to_pylist()


def every(filter, stats, schema=SCHEMA) -> list[bool]:
    return all_match(filter, stats, schema).to_pylist()


@pytest.mark.parametrize(
    "filter, expected_may, expected_all",
    [
        ("x = 5", [True, False, False, True, False], [False, False, False, False, True]),
        ("x = 25", [False, True, False, True, False], [False] * 4 + [True]),
        ("x != 5", [True, True, False, True, False], [False] * 4 + [True]),
        ("x < 0", [False, False, False, True, False], [False] * 4 + [True]),
        ("x <= 0", [True, False, False, True, False], [False] * 4 + [True]),
        ("x > 10", [False, True, False, True, False], [False] * 4 + [True]),
        ("x >= 0", [True, True, False, True, False], [True, False, False, False, True]),
        ("x < 100", [True, True, False, True, False], [True, False, False, False, True]),
        ("x IN (5, 25)", [True, True, False, True, False], [False] * 4 + [True]),
        ("x IN (11, 19)", [False, False, False, True, False], [False] * 4 + [True]),
        ("x IS NULL", [False, True, True, True, False], [False, False, True, False, True]),
        ("x IS NOT NULL", [True, True, False, True, False], [True, False, False, False, True]),
        ("NOT x < 20", [False, True, False, True, False], [False] * 4 + [True]),
        ("NOT x IS NULL", [True, True, False, True, False], [True, False, False, False, True]),
        ("NOT (x < 5 OR x > 25)", [True, True, False, True, False], [False] * 4 + [True]),
        ("x > 5 AND x < 25", [True, True, False, True, False], [False] * 4 + [True]),
        ("x > 25 OR x < 1", [True, True, False, True, False], [False] * 4 + [True]),
        ("s = 'kiwi'", [False, False, True, True, False], [False, False, False, True, True]),
        ("s LIKE 'ap%'", [True, False, True, False, False], [True, False, False, False, True]),
        ("s LIKE 'b%'", [False, True, True, False, False], [False] * 4 + [True]),
        ("s LIKE 'apri%'", [True, False, True, False, False], [False] * 4 + [True]),
        ("s LIKE 'c%'", [False, True, True, False, False], [False] * 4 + [True]),
        ("s LIKE 'cz%'", [False, False, True, False, False], [False] * 4 + [True]),
        ("s NOT LIKE 'ap%'", [False, True, True, True, False], [False, False, False, True, True]),
        ("s NOT IN ('kiwi')", [True, True, True, False, False], [True, False, False, False, True]),
        ("s NOT IN ('kiwi', NULL)", [False] * 5, [False] * 4 + [True]),
        (
            "s IN ('kiwi', 'lime')",
            [False, False, True, True, False],
            [False, False, False, True, True],
        ),
        ("x > s", None, None),  # different types: a ValidationError, tested below
        ("TRUE", [True, True, True, True, False], [True] * 5),
        ("FALSE", [False] * 5, [False] * 4 + [True]),
    ],
)
def test_rules(stats, filter, expected_may, expected_all):
    if expected_may is None:
        return
    assert may(filter, stats) == expected_may
    assert every(filter, stats) == expected_all


def test_column_vs_column_may_match_unless_a_side_is_all_null():
    schema = pa.schema({"a": pa.int64(), "b": pa.int64()})
    stats = pa.table(
        {"row_count": pa.array([2, 2], pa.int64()), "nulls.a": pa.array([0, 2], pa.int64())}
    )
    assert may("a > b", stats, schema) == [True, False]
    assert every("a > b", stats, schema) == [False, False]


def test_columns_without_statistics_may_match():
    stats = pa.table({"row_count": pa.array([5], pa.int64())})
    assert may("x = 1 AND s LIKE 'a%'", stats) == [True]
    assert may("x IS NULL", stats) == [True]
    assert every("x IS NOT NULL", stats) == [False]
    assert may("NOT x IN (1)", stats) == [True]


def test_unknown_columns_are_refused(stats):
    with pytest.raises(ColumnNotFound):
        may_match("nope = 1", stats, SCHEMA)


def test_large_in_lists_use_the_range_of_the_values(stats):
    values = [*range(100, 100 + 2 * IN_LIST_PER_VALUE_LIMIT), 5]
    assert may(col("x").isin(values), stats) == [True, True, False, True, False]
    assert may(col("x").isin(values[:-1]), stats) == [False, False, False, True, False]


def test_partition_values_prune_exactly():
    # One row per partition: min == max == the value, nulls is 0 or row_count.
    schema = pa.schema({"day": pa.date32(), "region": pa.string()})
    days = pa.array([dt.date(2026, 11, 1), dt.date(2026, 11, 2), None], pa.date32())
    regions = pa.array(["eu", "us", "eu"])
    partitions = pa.table(
        {
            "row_count": pa.array([10, 20, 30], pa.int64()),
            "min.day": days,
            "max.day": days,
            "nulls.day": pa.array([0, 0, 30], pa.int64()),
            "min.region": regions,
            "max.region": regions,
            "nulls.region": pa.array([0, 0, 0]),
        }
    )
    filter = "day >= '2026-11-02' OR region = 'eu'"
    assert may(filter, partitions, schema) == [True, True, True]
    assert every(filter, partitions, schema) == [True, True, True]
    filter = "day = '2026-11-01' AND region = 'eu'"
    assert may(filter, partitions, schema) == [True, False, False]
    assert every(filter, partitions, schema) == [True, False, False]
    assert every("day IS NULL", partitions, schema) == [False, False, True]


def test_float_columns_never_all_match_value_predicates():
    # min/max skip NaN: a file with stats [1, 2] may hold NaN, which fails x >= 0.
    schema = pa.schema({"f": pa.float64()})
    stats = pa.table(
        {
            "row_count": pa.array([3], pa.int64()),
            "min.f": [1.0],
            "max.f": [2.0],
            "nulls.f": pa.array([0], pa.int64()),
        }
    )
    assert every("f >= 0", stats, schema) == [False]
    assert may("f != 1", stats, schema) == [True]
    assert may("NOT f < 5", stats, schema) == [True]  # NOT (NaN < 5) is true
    assert may("f > 5", stats, schema) == [False]
    assert every("f IS NOT NULL", stats, schema) == [True]
    assert every("NOT f > 5", stats, schema) == [True]


def test_coerced_literals_in_statistics():
    schema = pa.schema(
        {
            "d": pa.date32(),
            "t": pa.timestamp("ms", "UTC"),
            "k": pa.dictionary(pa.int32(), pa.string()),
        }
    )
    stats = pa.table(
        {
            "row_count": pa.array([1, 1], pa.int64()),
            "min.d": pa.array([dt.date(2026, 1, 1), dt.date(2026, 6, 1)]),
            "max.d": pa.array([dt.date(2026, 2, 1), dt.date(2026, 7, 1)]),
            "min.t": pa.array(
                [dt.datetime(2026, 1, 1), dt.datetime(2026, 6, 1)], pa.timestamp("ms", "UTC")
            ),
            "max.t": pa.array(
                [dt.datetime(2026, 2, 1), dt.datetime(2026, 7, 1)], pa.timestamp("ms", "UTC")
            ),
            "min.k": pa.array(["a", "m"]).dictionary_encode(),
            "max.k": pa.array(["c", "z"]).dictionary_encode(),
        }
    )
    assert may("d >= '2026-03-01'", stats, schema) == [False, True]
    assert may("t > '2026-02-01 00:00:00.0005'", stats, schema) == [False, True]
    assert may("k LIKE 'b%'", stats, schema) == [True, False]
    assert may("k IN ('n', 'o')", stats, schema) == [False, True]


# -- property: pruning never drops a matching file, all_match never lies ---------------------

INTS = st.one_of(st.none(), st.integers(-3, 3))
FLOATS = st.one_of(st.none(), st.sampled_from([-1.5, -0.0, 0.0, 1.0, 2.5, float("nan")]))
# Strings over 256 characters have no stored bounds; decimals order by value, not text.
STRINGS = st.one_of(st.none(), st.text(alphabet="abé", max_size=3),
                    st.sampled_from(["a" * 300, "a" * 299 + "b", "é" * 257]))
DECIMALS = st.one_of(st.none(), st.sampled_from(
    [Decimal(v) for v in ("-50.00", "-0.50", "9.00", "9.50", "10.00", "100.25")]))
PROPERTY_SCHEMA = pa.schema({"i": pa.int64(), "f": pa.float64(), "s": pa.string(),
                             "d": pa.decimal128(10, 2)})
DOMAINS = {"i": INTS, "f": FLOATS, "s": STRINGS, "d": DECIMALS}


def leaf(name: str) -> st.SearchStrategy[Expr]:
    c = col(name)
    value = DOMAINS[name].filter(lambda v: v is not None)
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])

    def compare(op, v):
        return {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}[op]

    strategies = [
        st.builds(compare, ops, value),
        st.builds(lambda op, v: compare(op, lit(v)), ops, value),
        st.builds(c.isin, st.lists(DOMAINS[name], min_size=1, max_size=4)),
        st.builds(
            lambda vs: c.isin(vs),
            st.lists(
                value, min_size=IN_LIST_PER_VALUE_LIMIT + 1, max_size=IN_LIST_PER_VALUE_LIMIT + 3
            ),
        ),
        st.just(c.is_null()),
        st.just(c.is_not_null()),
    ]
    if name == "s":
        strategies.append(st.builds(c.startswith, st.text(alphabet="abé", max_size=2)))
    if name == "f":
        strategies.append(st.builds(compare, ops, st.just(col("i"))))
    return st.one_of(*strategies)


property_filters = st.recursive(
    st.one_of(leaf("i"), leaf("f"), leaf("s"), leaf("d")),
    lambda inner: st.one_of(
        st.builds(lambda a, b: a & b, inner, inner),
        st.builds(lambda a, b: a | b, inner, inner),
        st.builds(lambda a: ~a, inner),
    ),
    max_leaves=6,
)


@st.composite
def files(draw) -> tuple[list[pa.Table], frozenset[tuple[int, str]]]:
    n_files = draw(st.integers(1, 4))
    tables = []
    for _ in range(n_files):
        n = draw(st.integers(0, 5))
        tables.append(
            pa.table(
                {
                    name: pa.array(
                        draw(st.lists(DOMAINS[name], min_size=n, max_size=n)),
                        PROPERTY_SCHEMA.field(name).type,
                    )
                    for name in PROPERTY_SCHEMA.names
                },
                schema=PROPERTY_SCHEMA,
            )
        )
    unknown = draw(
        st.frozensets(
            st.tuples(st.integers(0, n_files - 1), st.sampled_from(PROPERTY_SCHEMA.names))
        )
    )
    return tables, unknown


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files(), property_filters)
def test_pruning_is_sound(data, filter):
    tables, unknown = data
    stats = file_stats(tables, unknown)
    may_answers = may_match(filter, stats, PROPERTY_SCHEMA).to_pylist()
    all_answers = all_match(filter, stats, PROPERTY_SCHEMA).to_pylist()
    for table, may_hold, all_hold in zip(tables, may_answers, all_answers, strict=True):
        mask = evaluate(filter, table).to_pylist()
        if not may_hold:
            assert not any(mask), f"{filter} was pruned but matches rows of {table.to_pydict()}"
        if all_hold:
            assert all(mask), f"{filter} all-matched but misses rows of {table.to_pydict()}"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=1, max_size=5),
    st.sampled_from(["=", "<", ">=", "!="]),
    st.integers(-3, 3),
)
def test_partition_answers_are_exact(values, op, v):
    # With one value per "file" (a partition), may_match and all_match agree with the rows.
    schema = pa.schema({"p": pa.int64()})
    tables = [pa.table({"p": pa.array([x], pa.int64())}) for x in values]
    stats = file_stats(tables)
    filter = f"p {op} {v}"
    truth = [evaluate(filter, t).to_pylist()[0] for t in tables]
    assert may_match(filter, stats, schema).to_pylist() == truth
    assert all_match(filter, stats, schema).to_pylist() == truth
