"""The one equality of stored values (``arrowlake.merge.equality``) over every Arrow type a
table can hold: nested types by value, NaN equal to NaN, nulls equal to nulls at any depth,
-0.0 different from 0.0, extension types by storage, the null type always equal."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from arrowlake.merge.equality import same_rows, same_values

NAN = float("nan")


def ext(typ: pa.ExtensionType, values: list) -> pa.Array:
    return pa.ExtensionArray.from_storage(typ, pa.array(values, typ.storage_type))


#: Per type: (left values, right values, expected per row). Every case has a null, an equal
#: pair and a different pair.
CASES = {
    "float64": (pa.array([1.0, NAN, -0.0, None, 0.0, None, NAN]),
                pa.array([1.0, NAN, 0.0, None, None, 2.0, 1.0]),
                [True, True, False, True, False, False, False]),
    "float32": (pa.array([NAN, 0.0, None], pa.float32()), pa.array([NAN, -0.0, None], pa.float32()),
                [True, False, True]),
    "float16": (pa.array(np.array([np.nan, 0.0, 1.0], np.float16)),
                pa.array(np.array([np.nan, -0.0, 1.0], np.float16)), [True, False, True]),
    "int": (pa.array([1, None, 3]), pa.array([1, None, 4]), [True, True, False]),
    "string": (pa.array(["a", None, ""]), pa.array(["a", None, None]), [True, True, False]),
    "decimal": (pa.array([1, None, 2], pa.decimal128(5, 2)),
                pa.array([1, None, 3], pa.decimal128(5, 2)), [True, True, False]),
    "timestamp": (pa.array([0, None, 2**62], pa.timestamp("ns", "Europe/Berlin")),
                  pa.array([0, None, 2**62 - 1], pa.timestamp("ns", "Europe/Berlin")),
                  [True, True, False]),
    "struct": (pa.array([{"a": 1, "f": NAN}, None, {"a": None, "f": 1.0}, {"a": 2, "f": 3.0},
                         {"a": None, "f": None}],
                        pa.struct([("a", pa.int64()), ("f", pa.float64())])),
               pa.array([{"a": 1, "f": NAN}, None, {"a": None, "f": 1.0}, {"a": 2, "f": 4.0},
                         None], pa.struct([("a", pa.int64()), ("f", pa.float64())])),
               [True, True, True, False, False]),
    "list": (pa.array([[1.0, NAN, None], None, [], [1.0], [1.0, 2.0], []]),
             pa.array([[1.0, NAN, None], None, [], [1.0, 2.0], [1.0, 3.0], None]),
             [True, True, True, False, False, False]),
    "large_list": (pa.array([["a"], None, ["b", None]], pa.large_list(pa.string())),
                   pa.array([["a"], None, ["b", "c"]], pa.large_list(pa.string())),
                   [True, True, False]),
    "fixed_size_list": (pa.array([[NAN, 1.0], None, [1.0, 2.0]], pa.list_(pa.float64(), 2)),
                        pa.array([[NAN, 1.0], None, [1.0, 3.0]], pa.list_(pa.float64(), 2)),
                        [True, True, False]),
    "list_view": (pa.array([[1, 2], None, [3]], pa.list_view(pa.int64())),
                  pa.array([[1, 2], None, [4]], pa.list_view(pa.int64())), [True, True, False]),
    "map": (pa.array([[("x", NAN)], None, [("a", 1.0), ("b", None)], [("a", 1.0)], []],
                     pa.map_(pa.string(), pa.float64())),
            pa.array([[("x", NAN)], None, [("a", 1.0), ("b", None)], [("b", 1.0)], []],
                     pa.map_(pa.string(), pa.float64())),
            [True, True, True, False, True]),
    "nested": (pa.array([[{"m": [("a", [1, None])]}, None], None, [{"m": [("a", [1])]}]],
                        pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int64())))]))),
               pa.array([[{"m": [("a", [1, None])]}, None], None, [{"m": [("a", [2])]}]],
                        pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int64())))]))),
               [True, True, False]),
    "uuid": (ext(pa.uuid(), [b"0123456789abcdef", None, b"0123456789abcdef"]),
             ext(pa.uuid(), [b"0123456789abcdef", None, b"0123456789abcdeF"]),
             [True, True, False]),
    "json": (ext(pa.json_(), [json.dumps([1]), None, "{}"]),
             ext(pa.json_(), [json.dumps([1]), None, "[]"]), [True, True, False]),
    "bool8": (ext(pa.bool8(), [1, None, 0]), ext(pa.bool8(), [1, None, 1]), [True, True, False]),
    "tensor": (ext(pa.fixed_shape_tensor(pa.float32(), [2]), [[NAN, 1], None, [1, 2]]),
               ext(pa.fixed_shape_tensor(pa.float32(), [2]), [[NAN, 1], None, [1, 3]]),
               [True, True, False]),
    "null": (pa.nulls(3), pa.nulls(3), [True, True, True]),
    "dictionary": (pa.array(["a", None, "b"]).dictionary_encode(),
                   pa.array(["a", None, "c"]).dictionary_encode(), [True, True, False]),
    "interval": (pa.array([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([0, 0, 1])],
                          pa.month_day_nano_interval()),
                 pa.array([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([0, 0, 2])],
                          pa.month_day_nano_interval()), [True, True, False]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_values_per_type(case):
    left, right, expected = CASES[case]
    assert same_values(left, right).tolist() == expected
    assert same_values(right, left).tolist() == expected
    # A value is always the same as itself, also in slices (offsets) and other chunkings.
    assert same_values(left, left).all()
    assert same_values(left.slice(1), right.slice(1)).tolist() == expected[1:]
    n = len(left)
    chunked = pa.chunked_array([left.slice(0, 1), left.slice(1)])
    assert same_values(chunked, pa.chunked_array([right])).tolist() == expected
    assert len(same_values(left.slice(n), right.slice(n))) == 0


def test_a_dictionary_and_its_values_compare_by_value():
    assert same_values(pa.array(["a", "b", None]).dictionary_encode(),
                       pa.array(["a", "c", None])).tolist() == [True, False, True]


def test_the_null_type_against_values_equals_only_nulls():
    assert same_values(pa.nulls(3), pa.array([1, None, 2])).tolist() == [False, True, False]


def test_values_under_null_parents_do_not_count():
    # Two null structs whose hidden children differ are both null: equal.
    s = pa.struct([("a", pa.int64())])
    children = pa.array([1, 2]), pa.array([1, 3])
    mask = pa.array([False, True])
    left = pa.StructArray.from_arrays([children[0]], fields=list(s), mask=mask)
    right = pa.StructArray.from_arrays([children[1]], fields=list(s), mask=mask)
    assert same_values(left, right).tolist() == [True, True]
    # A null list entry that still spans values in the child array.
    offsets = pa.array([0, 1, 3], pa.int32())
    a = pa.ListArray.from_arrays(offsets, pa.array([1, 2, 3]), mask=pa.array([False, True]))
    b = pa.ListArray.from_arrays(offsets, pa.array([1, 7, 8]), mask=pa.array([False, True]))
    assert same_values(a, b).tolist() == [True, True]


def test_same_rows_combines_every_column():
    before = pa.table({"k": [1, 2, 3], "v": [[NAN], [1.0], None]})
    after = pa.table({"k": [1, 2, 3], "v": [[NAN], [2.0], None]})
    assert same_rows(before, after).tolist() == [True, False, True]


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 and 1 rows"):
        same_values(pa.array([1, 2]), pa.array([1]))


def test_many_rows_are_compared_without_a_loop_per_row():
    rng = np.random.default_rng(7)
    values = rng.normal(size=200_000)
    values[rng.random(len(values)) < 0.1] = np.nan
    lengths = rng.integers(0, 4, size=50_001)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    left = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[:offsets[-1]]))
    changed = values.copy()
    where = rng.choice(offsets[-1], size=100, replace=False)
    changed[where] = 1e9  # no normal draw (nor NaN) is that
    right = pa.ListArray.from_arrays(pa.array(offsets), pa.array(changed[:offsets[-1]]))
    rows = np.searchsorted(offsets, where, side="right") - 1
    expected = np.ones(len(left), dtype=bool)
    expected[rows] = False
    assert (same_values(left, right) == expected).all()
