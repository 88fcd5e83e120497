"""a15: a filter's text form (``str(expr)``) parses back into the same filter, for every literal
the tree accepts. Deletes record their filter as this text and change streams re-read it to
find the deleted rows, so a literal that loses precision in print gives the wrong ``-D`` rows.
"""

import datetime as dt
import math
import zoneinfo
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from arrowlake.errors import ValidationError
from arrowlake.expressions import Expr, col, evaluate, lit, parse_filter
from tests.expressions.strategies import boolean_trees

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
INT64 = (-(2**63) + 1, 2**63 - 1)  # pandas keeps -2**63 for NaT
NS_SAFE = (-(2**63) + 10**14, 2**63 - 10**14)  # pandas' range, with room for any UTC offset


def round_trip(expr: Expr) -> Expr:
    parsed = parse_filter(str(expr))
    assert parsed == expr, f"{expr!r} printed as {str(expr)!r} parsed back as {parsed!r}"
    assert hash(parsed) == hash(expr)
    return parsed


# -- literal kinds: a strategy of values and the Arrow type of a column that holds them ----------

zones = st.sampled_from([None, dt.UTC, dt.timezone(dt.timedelta(hours=-3, minutes=-30)), PARIS])
units = st.sampled_from(["s", "ms", "us", "ns"])


def _ns_timestamp(nanos: int, tz) -> pd.Timestamp:
    stamp = pd.Timestamp(nanos, unit="ns")
    return stamp if tz is None else stamp.tz_localize("UTC").tz_convert(tz)


def _arrow_timestamp(count: int, unit: str, tz) -> pa.Scalar:
    limit = INT64[1] // {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[unit]
    return pa.scalar(max(-limit, min(limit, count)), pa.timestamp(unit, tz))


KINDS: dict[str, tuple[st.SearchStrategy, pa.DataType]] = {
    "int": (st.integers(*INT64), pa.int64()),
    "float": (st.floats(), pa.float64()),
    "float32": (st.floats(width=32).map(np.float32), pa.float64()),
    "decimal": (
        st.integers(0, 6).flatmap(
            lambda scale: st.decimals(-(10**20), 10**20, places=scale)
        ),
        pa.decimal128(38, 6),
    ),
    "str": (st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
            | st.sampled_from(["it's", "a\\", "''", "\\'", "line\nbreak", "\"q\"", "%_"]),
            pa.string()),
    "bytes": (st.binary(max_size=8), pa.binary()),
    "bool": (st.booleans(), pa.bool_()),
    "date": (st.dates(), pa.date32()),
    "datetime": (st.datetimes(), pa.timestamp("us")),
    "datetime_tz": (
        st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 1, 1),
                     timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5)),
                                                PARIS])),
        pa.timestamp("us", "UTC"),
    ),
    "pandas_ns": (st.builds(_ns_timestamp, st.integers(*NS_SAFE), zones),
                  pa.timestamp("ns", "UTC")),
    "pandas_ns_naive": (st.builds(_ns_timestamp, st.integers(*INT64), st.none()),
                        pa.timestamp("ns")),
    "numpy_datetime64": (
        st.builds(lambda n, u: np.datetime64(n // {"s": 10**9, "ms": 10**6, "us": 1000,
                                                   "ns": 1}[u], u),
                  st.integers(*INT64), units),
        pa.timestamp("ns"),
    ),
    "arrow_timestamp": (
        st.builds(_arrow_timestamp, st.integers(*INT64), units,
                  st.sampled_from([None, "UTC", "+05:30", "Europe/Paris"])),
        pa.timestamp("ns", "UTC"),
    ),
    "timedelta": (st.timedeltas(), pa.duration("us")),
    "pandas_timedelta": (st.integers(*INT64).map(lambda n: pd.Timedelta(n, unit="ns")),
                         pa.duration("ns")),
    "numpy_timedelta64": (
        st.builds(lambda n, u: np.timedelta64(n, u), st.integers(-(10**13), 10**13), units),
        pa.duration("ns"),
    ),
    "arrow_duration": (
        st.builds(lambda n, u: pa.scalar(n, pa.duration(u)), st.integers(-(10**13), 10**13),
                  units),
        pa.duration("ns"),
    ),
    "time": (st.times(), pa.time64("us")),
    "big_int": (st.integers(-(10**40), 10**40), None),  # prints and parses; no column type
}

kind_names = st.sampled_from(sorted(KINDS))


@st.composite
def literal(draw, kind=None):
    kind = kind or draw(kind_names)
    return kind, draw(KINDS[kind][0])


names = st.sampled_from(["a", "b.c", "my col", "and", "Date", 'q"uote', "interval", "x`y"]) | \
    st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=6)
ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])


def compare(c, op, v):
    return {"=": c == v, "!=": c != v, "<": c < v, "<=": c <= v, ">": c > v, ">=": c >= v}[op]


def leaves() -> st.SearchStrategy[Expr]:
    column = names.map(col)
    value = literal().map(lambda kv: kv[1])
    return st.one_of(
        st.builds(compare, column, ops, value),
        st.builds(compare, column, ops, column),
        st.builds(lambda c, vs: c.isin(vs), column,
                  st.lists(value | st.none(), min_size=1, max_size=3)),
        st.builds(lambda c: c.is_null(), column),
        st.builds(lambda c: c.is_not_null(), column),
        st.builds(lambda c, p: c.startswith(p), column,
                  st.text(st.characters(blacklist_categories=["Cs"]), max_size=4)),
    )


filters = boolean_trees(leaves())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filters)
def test_a15_any_filter_text_parses_back_to_the_same_tree(expr):
    round_trip(expr)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=kind_names.filter(lambda k: KINDS[k][1] is not None), data=st.data())
def test_a15_literals_of_every_kind_select_the_same_rows_after_a_round_trip(kind, data):
    value = data.draw(literal(kind))[1]
    others = data.draw(st.lists(literal(kind).map(lambda kv: kv[1]), max_size=4))
    column_type = KINDS[kind][1]
    try:
        column = pa.array([lit(v).value for v in [value, *others, None]], column_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        assume(False)  # values the column type cannot hold (years before 1677 in ns, ...)
        raise
    table = pa.table({"v": column})
    c = col("v")
    exprs = [compare(c, op, value) for op in ("=", "!=", "<", "<=", ">", ">=")]
    exprs.append(c.isin([value, *others]))
    for expr in exprs:
        parsed = round_trip(expr)
        try:
            expected = evaluate(expr, table)
        except ValidationError as exc:  # e.g. a value outside the column's unit's range
            with pytest.raises(type(exc)):
                evaluate(parsed, table)
            continue
        assert evaluate(parsed, table) == expected
        # NaN equals nothing, itself included (IEEE 754, as Arrow compares): float32
        # values come as numpy scalars.
        if expr is exprs[0] and not (isinstance(value, (float, np.floating))
                                     and math.isnan(value)):
            # The literal's own row matches it: no precision lost between value and column.
            assert expected[0].as_py(), f"{expr} does not select the row holding its value"


@pytest.mark.parametrize(
    "value, text",
    [
        (pd.Timestamp("2026-01-01 00:00:00.000000001"),
         "TIMESTAMP '2026-01-01 00:00:00.000000001'"),
        (pd.Timestamp("2026-01-01 00:00:00.000000001", tz="Europe/Paris"),
         "TIMESTAMP '2026-01-01 00:00:00.000000001+01:00'"),
        (pd.Timestamp("2026-01-01 00:00:00.000001"), "TIMESTAMP '2026-01-01 00:00:00.000001'"),
        (np.datetime64(1, "ns"), "TIMESTAMP '1970-01-01 00:00:00.000000001'"),
        (pa.scalar(1, pa.timestamp("ns", "UTC")),
         "TIMESTAMP '1970-01-01 00:00:00.000000001+00:00'"),
        (pd.Timedelta(1, unit="ns"), "INTERVAL '0.000000001' SECOND"),
        (np.timedelta64(-1500, "ns"), "INTERVAL '-0.0000015' SECOND"),
        (dt.timedelta(days=100_000, microseconds=1), "INTERVAL '8640000000.000001' SECOND"),
        (dt.timedelta.max, "INTERVAL '86399999999999.999999' SECOND"),
        (dt.timedelta(microseconds=-1), "INTERVAL '-0.000001' SECOND"),
        (float("nan"), "DOUBLE 'nan'"),
        (-0.0, "-0.0"),
        (0.1 + 0.2, "0.30000000000000004"),
        (np.float64(1e300), "1e+300"),
        (Decimal("-1.500E-7"), "DECIMAL '-1.500E-7'"),
        (2**100, str(2**100)),
        ("it's\n\\", "'it''s\n\\'"),
        (b"", "X''"),
        (dt.time(23, 59, 59, 999999), "TIME '23:59:59.999999'"),
    ],
)
def test_a15_literal_text_is_exact(value, text):
    expr = col("x") == value
    assert str(expr) == f"x = {text}"
    parsed = round_trip(expr)
    assert type(parsed.right.value) is type(expr.right.value)  # type: ignore[attr-defined]


def test_a15_nanosecond_literals_match_only_their_row():
    ts = pd.to_datetime(["2026-01-01 00:00:00.000000001", "2026-01-01 00:00:00.000000002"])
    table = pa.table({"ts": pa.array(ts),
                      "du": pa.array([pd.Timedelta(1), pd.Timedelta(2)], pa.duration("ns"))})
    for expr in (col("ts") == ts[0], col("du") == pd.Timedelta(1),
                 col("ts") == np.datetime64(ts[0].value, "ns")):
        assert evaluate(parse_filter(str(expr)), table).to_pylist() == [True, False]


def test_a15_literals_finer_than_the_column_compare_exactly():
    # A microsecond literal against a seconds column used to be truncated to 0 seconds, so
    # 'du = 1 microsecond' matched (and deleted) the rows holding zero.
    table = pa.table({"du": pa.array([0, 1], pa.duration("s")),
                      "t": pa.array([0, 1], pa.time32("s"))})
    assert evaluate(col("du") == dt.timedelta(microseconds=1), table).to_pylist() == [False] * 2
    assert evaluate(col("du") < dt.timedelta(seconds=1, microseconds=1), table).to_pylist() == [
        True, True]
    assert evaluate(col("t") == dt.time(0, 0, 0, 1), table).to_pylist() == [False, False]
    assert evaluate(col("t") > dt.time(0, 0, 0, 1), table).to_pylist() == [False, True]


def test_a15_values_that_cannot_be_exact_are_refused():
    with pytest.raises(ValidationError, match="microseconds at most"):
        lit(pa.scalar(1, pa.time64("ns")))
    with pytest.raises(ValidationError, match="no fixed length"):
        lit(np.timedelta64(1, "M"))
    with pytest.raises(ValidationError, match="finite"):
        lit(Decimal("NaN"))
    with pytest.raises(ValidationError, match="Unsupported literal"):
        lit(pa.scalar(-(10**15), pa.duration("s")))  # past what a timedelta holds
    assert lit(pd.NaT).value is None and lit(np.datetime64("NaT")).value is None


@pytest.mark.parametrize(
    "text, value",
    [
        # What earlier versions recorded for deletes: durations as float seconds, at most
        # microseconds in timestamps, NaN and infinities as DOUBLE.
        ("INTERVAL '3600.0' SECOND", dt.timedelta(hours=1)),
        ("INTERVAL '-0.5' SECOND", dt.timedelta(seconds=-0.5)),
        ("INTERVAL '1e-06' SECOND", dt.timedelta(microseconds=1)),
        ("INTERVAL '1e-09' SECOND", pd.Timedelta(1, unit="ns")),
        ("INTERVAL '8640000000.0' SECOND", dt.timedelta(days=100_000)),
        ("INTERVAL '0.30000000000000004' SECOND", dt.timedelta(microseconds=300000)),
        ("TIMESTAMP '2026-11-01 10:00:00.250000+02:00'",
         dt.datetime(2026, 11, 1, 10, 0, 0, 250000, dt.timezone(dt.timedelta(hours=2)))),
        ("TIMESTAMP '2026-11-01T10:00:00Z'", dt.datetime(2026, 11, 1, 10, tzinfo=dt.UTC)),
        ("DOUBLE 'inf'", float("inf")),
        ("DOUBLE '-inf'", float("-inf")),
        ("DECIMAL '1.50'", Decimal("1.50")),
        ("TIME '10:00:00'", dt.time(10)),
    ],
)
def test_filter_text_recorded_by_earlier_versions_still_parses(text, value):
    assert parse_filter(f"x = {text}") == (col("x") == value)


def test_a15_time_zones_become_their_offsets():
    # A zone's name is not part of the text; its offset at that instant is, and the parsed
    # value is the same instant. (An aware datetime in a zone is not even equal to itself in
    # another zone during a DST fold, so zones are turned into offsets when the literal is
    # made.)
    fold = dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=PARIS)
    expr = col("t") == fold
    assert expr.right.value.utcoffset() == dt.timedelta(hours=1)  # type: ignore[attr-defined]
    round_trip(expr)
    table = pa.table({"t": pa.array([fold], pa.timestamp("us", "Europe/Paris"))})
    assert evaluate(parse_filter(str(expr)), table).to_pylist() == [True]
