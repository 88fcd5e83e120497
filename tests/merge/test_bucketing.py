"""The bucket hash follows its documented definition, in every type and process."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.merge.bucketing import bucket_of, key_hash

M = 2**64


def mix(x: int) -> int:
    """SplitMix64's finalizer, written from its definition."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) % M
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) % M
    return x ^ (x >> 31)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % M
    return h


def reference(values: list, kind: str) -> int:
    h = None
    for value, k in zip(values, kind, strict=True):
        if k == "i":
            col = mix(value % M)
        else:
            col = mix(fnv1a(value.encode() if isinstance(value, str) else value))
        h = col if h is None else mix((h * 31 + col) % M)
    assert h is not None
    return h


def test_pinned_values():
    # These exact numbers are the contract with other engines: never change them.
    t = pa.table({"i": pa.array([0, 1, -1, 42], pa.int64()), "s": ["", "a", "hello", "ключ"]})
    assert key_hash(t, ["i"]).tolist() == [0, 6238072747940578789, 13029008266876403067,
                                          12058926934050108962]
    assert bucket_of(t, ["i"], 7).to_pylist() == [0, 6, 0, 3]
    assert key_hash(t, ["s"]).tolist()[1] == reference(["a"], "s")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20)),
                min_size=1, max_size=30))
def test_matches_the_reference_definition(rows):
    t = pa.table({"i": pa.array([r[0] for r in rows], pa.int64()),
                  "s": pa.array([r[1] for r in rows], pa.string())})
    assert key_hash(t, ["i"]).tolist() == [reference([r[0]], "i") for r in rows]
    assert key_hash(t, ["s"]).tolist() == [reference([r[1]], "s") for r in rows]
    assert key_hash(t, ["i", "s"]).tolist() == [reference(list(r), "is") for r in rows]


@pytest.mark.parametrize("typ", [pa.int8(), pa.int32(), pa.uint16(), pa.int64()])
def test_integer_widths_hash_alike(typ):
    values = [0, 1, 5, 100]
    a = key_hash(pa.table({"k": pa.array(values, typ)}), ["k"])
    b = key_hash(pa.table({"k": pa.array(values, pa.int64())}), ["k"])
    assert a.tolist() == b.tolist()


def test_string_layouts_hash_alike():
    values = ["x", "yy", "", "zzz"]
    hashes = [key_hash(pa.table({"k": pa.array(values, t)}), ["k"]).tolist()
              for t in (pa.string(), pa.large_string(), pa.string_view())]
    dictionary = key_hash(pa.table({"k": pa.array(values).dictionary_encode()}), ["k"]).tolist()
    assert hashes[0] == hashes[1] == hashes[2] == dictionary


def test_temporal_and_decimal_keys():
    day = dt.date(2026, 11, 1)
    days = (day - dt.date(1970, 1, 1)).days
    t = pa.table({"d": pa.array([day], pa.date32())})
    assert key_hash(t, ["d"]).tolist() == [mix(days)]
    ts = pa.table({"t": pa.array([1_000], pa.timestamp("ms", tz="UTC"))})
    assert key_hash(ts, ["t"]).tolist() == [mix(1_000)]
    dec = pa.table({"x": pa.array([Decimal("1.50")], pa.decimal128(5, 2))})
    assert key_hash(dec, ["x"]).tolist() == [reference(["1.50"], "s")]


def test_same_buckets_in_another_process():
    code = ("import pyarrow as pa; from arrowlake.merge.bucketing import bucket_of; "
            "t = pa.table({'k': pa.array(range(1000), pa.int64())}); "
            "print(bucket_of(t, ['k'], 8).to_pylist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": "",
                                              # the same arrowlake as this process imports
                                              "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    here = bucket_of(pa.table({"k": pa.array(range(1000), pa.int64())}), ["k"], 8).to_pylist()
    assert out.strip() == str(here)


def test_every_layout_gives_the_same_hash():
    """A value's hash never depends on how its column is laid out: long low-cardinality
    columns, short ones, equal-length values, every string and binary layout, dictionaries,
    slices and chunks."""
    values = ["eu", None, "apac", "ü", "", "same-width-1", "same-width-2"] * 5000

    def hashed(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return key_hash(pa.table({"k": column}), ["k"])

    column = pa.array(values)
    whole = hashed(column)
    one_by_one = np.concatenate([hashed(column.slice(i, 1)) for i in range(7)])
    assert (whole[:7] == one_by_one).all()
    for typ in (pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(),
                pa.binary_view()):
        assert (hashed(column.cast(typ)) == whole).all(), typ
    assert (hashed(column.dictionary_encode()) == whole).all()
    assert (hashed(column.cast(pa.string_view()).dictionary_encode()) == whole).all()
    assert (hashed(pa.chunked_array([column.slice(0, 10), column.slice(10)])) == whole).all()
    width = pa.array(["same-width-1", "same-width-2"] * 3)
    assert (hashed(width) == whole[[5, 6] * 3]).all()
    decimals = pa.array([1, 2, None] * 10_000, pa.decimal128(5, 2))
    assert (hashed(decimals)[:3] == hashed(decimals.slice(0, 3))).all()
