"""Shared by the native-core tests: random key columns of every key type arrowlake supports,
and a plain-Python model of how the kernels order keys."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

_TEXT = st.text(alphabet=st.sampled_from("ab\u00e9\u4e2d\x00z"), max_size=6)
_BYTES = st.binary(max_size=6)


def _value_key(value: Any) -> tuple:
    """A value as something Python orders like the native kernels: floats numerically with
    ``-0.0`` equal to ``0.0``, every NaN equal and above everything."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value + 0.0)
    return (0, value)


def row_keys(table: pa.Table, key: Sequence[str]) -> list[tuple]:
    """Each row's key as a tuple that Python compares as the kernels compare keys (a model
    for the tests: strings by code point, which is UTF-8's byte order)."""
    columns = [table[name].to_pylist() for name in key]
    return [tuple(_value_key(c[i]) for c in columns) for i in range(table.num_rows)]


def _values(kind: str) -> st.SearchStrategy:
    small = st.integers(-3, 3)
    return {
        "int64": st.integers(-(2**63), 2**63 - 1) | small,
        "int32": st.integers(-(2**31), 2**31 - 1) | small,
        "int8": st.integers(-128, 127),
        "uint64": st.integers(0, 2**64 - 1) | st.integers(0, 3),
        "uint16": st.integers(0, 2**16 - 1),
        "bool": st.booleans(),
        "date32": st.dates(dt.date(1900, 1, 1), dt.date(2100, 1, 1)),
        "time64": st.times(),
        "ts_tz": st.integers(-(2**40), 2**40) | small,
        "ts_ns": st.integers(-(2**62), 2**62) | small,
        "duration": st.integers(-(2**40), 2**40) | small,
        "decimal": st.decimals(min_value=Decimal("-9999.999"), max_value=Decimal("9999.999"),
                               places=3, allow_nan=False, allow_infinity=False),
        "decimal_neg_scale": st.integers(-999, 999).map(lambda v: Decimal(v) * 100),
        "decimal256": st.decimals(min_value=Decimal("-1e30"), max_value=Decimal("1e30"),
                                  places=2, allow_nan=False, allow_infinity=False),
        "string": _TEXT,
        "large_string": _TEXT,
        "string_view": _TEXT | st.text(min_size=13, max_size=20),  # views longer than inline
        "binary": _BYTES,
        "large_binary": _BYTES,
        "binary_view": _BYTES | st.binary(min_size=13, max_size=20),
        "fixed_binary": st.binary(min_size=3, max_size=3),
        "dictionary": st.sampled_from(["red", "green", "blue", ""]),
    }[kind]


TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "int8": pa.int8(),
    "uint64": pa.uint64(),
    "uint16": pa.uint16(),
    "bool": pa.bool_(),
    "date32": pa.date32(),
    "time64": pa.time64("us"),
    "ts_tz": pa.timestamp("ms", tz="America/New_York"),
    "ts_ns": pa.timestamp("ns"),
    "duration": pa.duration("s"),
    "decimal": pa.decimal128(9, 3),
    "decimal_neg_scale": pa.decimal128(7, -2),
    "decimal256": pa.decimal256(40, 2),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "string_view": pa.string_view(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "binary_view": pa.binary_view(),
    "fixed_binary": pa.binary(3),
    "dictionary": pa.dictionary(pa.int32(), pa.string()),
}

KEY_TYPES = sorted(TYPES)


def column(kind: str, values: list) -> pa.Array:
    if kind == "dictionary":
        return pa.array(values, pa.string()).dictionary_encode()
    return pa.array(values, TYPES[kind])


@st.composite
def key_columns(draw: st.DrawFn, rows: int, kinds: list[str], *, distinct: int | None = None,
                nulls: bool = False) -> list[pa.Array]:
    """Columns of the given kinds, ``rows`` long, drawn from ``distinct`` values each (so that
    keys repeat)."""
    out = []
    for kind in kinds:
        pool_size = distinct or rows
        pool = draw(st.lists(_values(kind), min_size=1, max_size=max(pool_size, 1)))
        values = draw(st.lists(st.sampled_from(pool), min_size=rows, max_size=rows))
        if nulls:
            values = [None if draw(st.integers(0, 5)) == 0 else v for v in values]
        out.append(column(kind, values))
    return out


key_kinds = st.sampled_from(KEY_TYPES)
composite_kinds = st.lists(key_kinds, min_size=1, max_size=3)
