"""The merge kernel against a plain-Python model: every key type (floats included), random
histories of sequences, sequence fields and nulls.

The model sorts row numbers with Python's ``sorted`` on ``(key values, sequence field, _seq,
row)``: obviously right, and slow, which the small inputs allow. The engines' own reductions
(partial-update, aggregation) run on top of :func:`group_versions` and are tested with
explicit expectations in ``tests/merge``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.errors import ValidationError
from arrowlake.merge import Aggregation, Deduplicate, FirstRow, MergeEngine, PartialUpdate
from arrowlake.merge.engines import unique_run_order
from arrowlake.merge.versions import group_versions, winners
from tests.native.support import composite_kinds, key_columns, row_keys


def _version_keys(table: pa.Table, sequence_field: str | None) -> list[tuple]:
    seq = table["_seq"].to_pylist()
    field = (table[sequence_field].to_pylist() if sequence_field is not None
             else [None] * table.num_rows)
    return [((0,) if sequence_field is None or f is None else (1, f), s, i)
            for i, (f, s) in enumerate(zip(field, seq, strict=True))]


def model_versions(table: pa.Table, key: list[str], sequence_field: str | None
                   ) -> tuple[list[int], list[int]]:
    """``(order, starts)`` as :func:`group_versions` must give them."""
    keys, versions = row_keys(table, key), _version_keys(table, sequence_field)
    order = sorted(range(table.num_rows), key=lambda i: (keys[i], versions[i]))
    starts = [p for p in range(len(order)) if p == 0 or keys[order[p]] != keys[order[p - 1]]]
    return order, starts


@st.composite
def float_keys(draw: st.DrawFn, n: int) -> pa.Array:
    pool = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 1.5, -2.25, 1e300]
    values = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    return pa.array(values, draw(st.sampled_from([pa.float64(), pa.float32()])))


@st.composite
def histories(draw: st.DrawFn) -> tuple[pa.Table, list[str], str | None]:
    """Rows of several runs of one bucket: key columns, ``_seq`` (runs oldest first, or
    shuffled) and maybe a nullable sequence field; keys repeat."""
    n = draw(st.integers(0, 30))
    if draw(st.integers(0, 4)) == 0:
        keys = [draw(float_keys(n))]
        if draw(st.booleans()):
            keys.append(draw(key_columns(n, ["string"], distinct=3))[0])
    else:
        keys = draw(key_columns(n, draw(composite_kinds), distinct=4))
    columns: dict[str, pa.Array] = {f"k{i}": c for i, c in enumerate(keys)}
    sequence_field = draw(st.sampled_from([None, "ts", "ts_text"]))
    nullable = st.none() | st.integers(0, 5)
    columns["ts"] = pa.array(draw(st.lists(nullable, min_size=n, max_size=n)), pa.int64())
    texts = st.none() | st.sampled_from(["2024-01", "2023-12", "2024-1"])
    columns["ts_text"] = pa.array(draw(st.lists(texts, min_size=n, max_size=n)), pa.string())
    seq = sorted(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    if draw(st.booleans()):
        seq = draw(st.permutations(seq))
    columns["_seq"] = pa.array(seq, pa.int64())
    return pa.table(columns), [f"k{i}" for i in range(len(keys))], sequence_field


@settings(max_examples=300, deadline=None)
@given(history=histories())
def test_versions_and_winners_equal_the_model(
        history: tuple[pa.Table, list[str], str | None]) -> None:
    table, key, sequence_field = history
    order, starts = model_versions(table, key, sequence_field)
    versions = group_versions(table, key, sequence_field)
    assert versions.order.tolist() == order
    assert versions.starts.tolist() == starts
    ends = [*starts[1:], len(order)] if order else []
    assert winners(table, key, sequence_field).tolist() == [order[e - 1] for e in ends]
    assert winners(table, key, sequence_field, oldest=True).tolist() == [order[s] for s in starts]


@settings(max_examples=150, deadline=None)
@given(history=histories(), first_row=st.booleans())
def test_deduplicate_and_first_row_keep_the_winners(
        history: tuple[pa.Table, list[str], str | None], first_row: bool) -> None:
    table, key, sequence_field = history
    table = table.append_column("_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    order, starts = model_versions(table, key, sequence_field)
    ends = [*starts[1:], len(order)] if order else []
    engine: MergeEngine = FirstRow() if first_row else Deduplicate()
    expected = [order[s] for s in starts] if first_row else [order[e - 1] for e in ends]
    assert engine.merge(table, key, sequence_field)["_row"].to_pylist() == expected


@settings(max_examples=150, deadline=None)
@given(data=st.data(), kinds=composite_kinds, n=st.integers(1, 40), groups=st.integers(1, 5))
def test_a_write_is_cut_into_groups_as_the_model_sorts_it(
        data: st.DataObject, kinds: list[str], n: int, groups: int) -> None:
    keys = data.draw(key_columns(n, kinds, distinct=data.draw(st.integers(2, 40))))
    table = pa.table({f"k{i}": c for i, c in enumerate(keys)})
    key = table.column_names
    codes = np.asarray(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)),
                       dtype=np.int64)
    got = unique_run_order(table, key, codes)
    rows = row_keys(table, key)
    model = sorted(range(n), key=lambda i: (int(codes[i]), rows[i], i))
    repeated = any((codes[a], rows[a]) == (codes[b], rows[b])
                   for a, b in pairwise(model))
    if repeated:
        assert got is None
    else:
        assert got is not None and got.tolist() == model


def test_float_keys_merge_zeros_and_nans() -> None:
    table = pa.table({"f": pa.array([0.0, -0.0, 1.5, math.nan, -math.nan]),
                      "v": [1, 2, 3, 4, 5], "_seq": [1, 2, 3, 4, 5]})
    merged = Deduplicate().merge(table, ["f"])
    assert merged["v"].to_pylist() == [2, 3, 5]


def test_null_keys_and_nested_keys_are_refused() -> None:
    table = pa.table({"id": pa.array([1, None], pa.int64()), "_seq": pa.array([1, 2])})
    with pytest.raises(ValidationError, match="may not be null: 1 null rows"):
        Deduplicate().merge(table, ["id"])
    nested = pa.table({"id": pa.array([[1], [2]]), "_seq": pa.array([1, 2])})
    for engine in (Deduplicate(), PartialUpdate()):
        with pytest.raises(ValidationError, match="cannot be part of a primary key"):
            engine.merge(nested, ["id"])


def test_a_missing_sequence_field_is_refused_when_versions_need_it() -> None:
    table = pa.table({"id": [1, 1], "_seq": pa.array([1, 2])})
    with pytest.raises(Exception, match="Sequence field 'ts' is not in the data"):
        Deduplicate().merge(table, ["id"], "ts")
    unique = pa.table({"id": [1, 2], "_seq": pa.array([1, 2])})
    assert Deduplicate().merge(unique, ["id"], "ts").num_rows == 2


def test_decimal_sums_of_runs() -> None:
    table = pa.table({"id": ["a", "a", "b"], "d": pa.array([Decimal("1.10"), Decimal("2.05"),
                                                           None], pa.decimal128(5, 2)),
                      "_row_kind": pa.array([0, 1, 0], pa.int8()), "_seq": [1, 2, 3]})
    merged = Aggregation({"d": "sum"}).merge(table, ["id"])
    assert merged["d"].to_pylist() == [Decimal("-0.95"), None]
