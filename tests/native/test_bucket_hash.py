"""The native bucket hash equals the numpy one (tests/native/reference.py, the hash every lake
written before the native core was bucketed by) for every key type, composite keys, nulls and
dictionary columns: existing lakes keep their buckets."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.merge.bucketing import bucket_of, key_hash
from tests.native import reference
from tests.native.support import KEY_TYPES, column, composite_kinds, key_columns


def _table(columns: list[pa.Array]) -> pa.Table:
    return pa.table({f"k{i}": c for i, c in enumerate(columns)})


@settings(max_examples=60, deadline=None)
@given(data=st.data(), kinds=composite_kinds, rows=st.integers(0, 40),
       buckets=st.integers(1, 64), nulls=st.booleans())
def test_hash_and_bucket_equal_numpy(data: st.DataObject, kinds: list[str], rows: int,
                                     buckets: int, nulls: bool) -> None:
    table = _table(data.draw(key_columns(rows, kinds, distinct=5, nulls=nulls)))
    key = table.column_names
    native_hash = key_hash(table, key)
    assert isinstance(native_hash, np.ndarray) and native_hash.dtype == np.uint64
    np.testing.assert_array_equal(native_hash, reference.key_hash(table, key))
    native_buckets = bucket_of(table, key, buckets)
    assert native_buckets.type == pa.int32()
    assert native_buckets == reference.bucket_of(table, key, buckets)


def _large(kind: str, rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` values of ``kind`` drawn from 50 distinct ones."""
    codes = rng.integers(0, 50, n)
    kind_type = column(kind, [None]).type
    t = pa.types
    if kind == "dictionary" or t.is_string(kind_type) or t.is_large_string(kind_type) \
            or t.is_string_view(kind_type):
        return column(kind, [f"k{v}" for v in codes])
    if t.is_binary(kind_type) or t.is_large_binary(kind_type) or t.is_binary_view(kind_type):
        return column(kind, [f"k{v}".encode() for v in codes])
    if t.is_fixed_size_binary(kind_type):
        return column(kind, [f"{v:03d}".encode() for v in codes])
    if t.is_boolean(kind_type):
        return pa.array(codes % 2 == 0)
    if t.is_decimal(kind_type):
        return pa.array([Decimal(int(v) - 25) * 100 for v in codes], kind_type)
    if t.is_integer(kind_type):
        return pa.array(codes).cast(kind_type)
    width = pa.int32() if kind_type.bit_width == 32 else pa.int64()
    return pa.array(codes - 25).cast(width).view(kind_type)


@pytest.mark.parametrize("kind", KEY_TYPES)
def test_large_chunked_columns_of_each_type(kind: str) -> None:
    # Past 16,384 rows the reference dictionary-encodes repetitive text: the same hashes.
    array = _large(kind, np.random.default_rng(7), 20_000)
    table = pa.table({"k": pa.chunked_array([array.slice(0, 7_000), array.slice(7_000)])})
    np.testing.assert_array_equal(key_hash(table, ["k"]), reference.key_hash(table, ["k"]))


@pytest.mark.parametrize("call", [lambda t, k: key_hash(t, k),
                                  lambda t, k: bucket_of(t, k, 4)])
def test_unhashable_types_are_refused_alike(call: Callable[[pa.Table, list[str]], object]
                                            ) -> None:
    """A TypeError naming the type (a dictionary's value type) before the native kernel sees
    the column, worded as the reference words it."""
    cases = [
        ("double", pa.array([1.5, 2.5])),
        ("double", pa.array([1.5, 1.5]).dictionary_encode()),
        ("list<item: int64>", pa.array([[1], [2]])),
        ("struct<a: int64>", pa.array([{"a": 1}, {"a": 2}])),
    ]
    for name, values in cases:
        table = pa.table({"i": [1, 2], "f": values})
        expected = f"Cannot hash key values of type {name}"
        for key in (["f"], ["i", "f"]):
            with pytest.raises(TypeError) as info:
                call(table, key)
            assert str(info.value) == expected
        with pytest.raises(TypeError) as info:
            reference.key_hash(table, ["f"])
        assert str(info.value) == expected


@pytest.mark.parametrize("kind", [
    pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us", tz="UTC"),
    pa.timestamp("ns", tz="Asia/Kolkata"), pa.duration("ms"), pa.duration("us"),
    pa.duration("ns"), pa.time32("s"), pa.time32("ms"), pa.time64("ns"), pa.date64(),
    pa.int16(), pa.uint8(), pa.uint32(), pa.decimal32(7, 3), pa.decimal64(15, -3),
    pa.decimal256(60, 30), pa.large_binary(), pa.dictionary(pa.int8(), pa.binary()),
    pa.dictionary(pa.uint16(), pa.int64()),
])
def test_every_width_and_unit(kind: pa.DataType) -> None:
    rng = np.random.default_rng(3)
    ints = rng.integers(-(2**31), 2**31, 500)
    t = pa.types
    if t.is_time32(kind):
        array = pa.array(np.abs(ints) % 86_400, pa.int32()).view(kind)
    elif t.is_time64(kind):
        array = pa.array(np.abs(ints) * 1000, pa.int64()).view(kind)
    elif t.is_decimal(kind):
        digits = [Decimal(int(v) % 9999) for v in ints]
        array = pa.array([d.scaleb(-3) if kind.scale >= 0 else d * 1000 for d in digits], kind)
    elif t.is_dictionary(kind):
        values = [str(v % 7).encode() for v in ints] if t.is_binary(kind.value_type) else \
            [int(v % 7) for v in ints]
        array = pa.array(values, kind.value_type).dictionary_encode().cast(kind)
    elif t.is_large_binary(kind):
        array = pa.array([str(v).encode() for v in ints], kind)
    elif t.is_integer(kind):
        array = pa.array(ints).cast(kind, safe=False)
    else:
        array = pa.array(ints, pa.int64()).view(kind)
    mask = pa.array(np.arange(500) % 9 == 0)
    nulls = pa.compute.if_else(mask, pa.scalar(None, array.type), array) \
        if not t.is_dictionary(kind) else array
    table = pa.table({"k": nulls, "i": pa.array(ints)})
    np.testing.assert_array_equal(key_hash(table, ["k", "i"]),
                                  reference.key_hash(table, ["k", "i"]))
