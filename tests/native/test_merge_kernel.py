"""The merge kernel gives the same result on the native path as on the numpy one: every engine,
every key type, random histories of row kinds, sequences, sequence fields and nulls."""

from __future__ import annotations

from decimal import Decimal
from itertools import pairwise

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.merge import Aggregation, Deduplicate, FirstRow, MergeEngine, PartialUpdate
from arrowlake.merge.engines import dedupe_within_write, unique_run_order
from arrowlake.merge.read import MergeSpec, merge_together
from arrowlake.merge.versions import take_rows
from tests.native.support import both, composite_kinds, key_columns

FUNCTIONS = {
    "a": ["sum", "count", "min", "max", "last_value", "last_non_null_value", "first_value",
          "first_non_null_value"],
    "s": ["min", "max", "listagg", "last_value", "first_non_null_value", "last_non_null_value"],
    "d": ["sum", "min", "max", "last_non_null_value"],
    "b": ["bool_and", "bool_or", "first_value"],
}


@st.composite
def engines(draw: st.DrawFn) -> MergeEngine:
    name = draw(st.sampled_from(["deduplicate", "first-row", "partial-update", "aggregation"]))
    if name == "deduplicate":
        return Deduplicate(ignore_delete=draw(st.booleans()))
    if name == "first-row":
        return FirstRow()
    if name == "partial-update":
        return PartialUpdate(ignore_delete=draw(st.booleans()))
    functions = {column: draw(st.sampled_from(options)) for column, options in FUNCTIONS.items()}
    return Aggregation(functions=functions,
                       ignore_retract=frozenset(draw(st.sets(st.sampled_from(list(FUNCTIONS))))),
                       remove_record_on_delete=draw(st.booleans()))


def _nullable(draw: st.DrawFn, values: st.SearchStrategy, n: int) -> list:
    return draw(st.lists(st.none() | values, min_size=n, max_size=n))


@st.composite
def histories(draw: st.DrawFn) -> tuple[pa.Table, list[str], str | None]:
    """Rows of several runs of one bucket: key columns, values, ``_row_kind``, ``_seq`` and
    maybe a sequence field; keys repeat."""
    n = draw(st.integers(0, 30))
    kinds = draw(composite_kinds)
    keys = draw(key_columns(n, kinds, distinct=4))
    columns = {f"k{i}": c for i, c in enumerate(keys)}
    columns["a"] = pa.array(_nullable(draw, st.integers(-100, 100), n), pa.int64())
    columns["s"] = pa.array(_nullable(draw, st.sampled_from(["x", "y", "zz", ""]), n))
    columns["d"] = pa.array(_nullable(draw, st.decimals("-9.99", "9.99", places=2), n),
                            pa.decimal128(5, 2))
    columns["b"] = pa.array(_nullable(draw, st.booleans(), n), pa.bool_())
    sequence_field = draw(st.sampled_from([None, "ts", "ts_text"]))
    columns["ts"] = pa.array(_nullable(draw, st.integers(0, 5), n), pa.int64())
    columns["ts_text"] = pa.array(_nullable(draw, st.sampled_from(["2024-01", "2023-12"]), n))
    kinds_of_rows = draw(st.lists(st.sampled_from([0, 0, 0, 1, 2, 3, 4]), min_size=n,
                                  max_size=n))
    columns["_row_kind"] = pa.array(kinds_of_rows, pa.int8())
    # Runs oldest first (sequence non-decreasing) or shuffled.
    seq = sorted(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    if draw(st.booleans()):
        seq = draw(st.permutations(seq))
    columns["_seq"] = pa.array(seq, pa.int64())
    return pa.table(columns), list(columns)[: len(keys)], sequence_field


def _same(numpy_result: object, native_result: object) -> None:
    if isinstance(numpy_result, tuple) and issubclass(numpy_result[0], pa.ArrowException):
        # Arrow has no sort or comparison for some key types the numpy path hands it
        # (decimals with a negative scale, dictionaries in composite keys): a raw Arrow error
        # there, a merge on the native path. Nothing to compare with.
        return
    if isinstance(numpy_result, pa.Table):
        assert isinstance(native_result, pa.Table), native_result
        assert native_result.schema == numpy_result.schema
        assert native_result.to_pylist() == numpy_result.to_pylist()
    else:
        assert native_result == numpy_result


@settings(max_examples=250, deadline=None)
@given(history=histories(), engine=engines(), keep=st.booleans())
def test_every_engine_merges_alike(history: tuple[pa.Table, list[str], str | None],
                                   engine: MergeEngine, keep: bool) -> None:
    table, key, sequence_field = history
    _same(*both(lambda: engine.merge(table, key, sequence_field, keep)))


@settings(max_examples=100, deadline=None)
@given(history=histories(), engine=engines())
def test_a_write_is_deduplicated_alike(history: tuple[pa.Table, list[str], str | None],
                                       engine: MergeEngine) -> None:
    table, key, sequence_field = history
    table = table.drop_columns(["_seq"])
    _same(*both(lambda: dedupe_within_write(table, key, engine, sequence_field)))


@settings(max_examples=100, deadline=None)
@given(history=histories(), units=st.integers(1, 3), data=st.data())
def test_buckets_merged_together_alike(history: tuple[pa.Table, list[str], str | None],
                                       units: int, data: st.DataObject) -> None:
    # merge_together leads the key with an int32 unit column: a composite key natively.
    table, key, sequence_field = history
    cuts = sorted(data.draw(st.lists(st.integers(0, table.num_rows), min_size=units - 1,
                                     max_size=units - 1)))
    bounds = [0, *cuts, table.num_rows]

    class Part:
        def __init__(self, rows: pa.Table) -> None:
            self.rows = rows

        def table(self) -> pa.Table:
            return self.rows

    parts = [Part(table.slice(lo, hi - lo)) for lo, hi in pairwise(bounds)]
    spec = MergeSpec(tuple(key), Deduplicate(), sequence_field)
    numpy_result, native_result = both(lambda: merge_together(spec, parts))  # type: ignore[arg-type]
    if not isinstance(numpy_result, list):
        _same(numpy_result, native_result)
        return
    assert isinstance(native_result, list)
    for a, b in zip(numpy_result, native_result, strict=True):
        _same(a, b)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), kinds=composite_kinds, n=st.integers(1, 40), groups=st.integers(1, 5),
       first_row=st.booleans())
def test_a_write_is_cut_into_groups_alike(data: st.DataObject, kinds: list[str], n: int,
                                          groups: int, first_row: bool) -> None:
    keys = data.draw(key_columns(n, kinds, distinct=data.draw(st.integers(2, 40))))
    table = pa.table({f"k{i}": c for i, c in enumerate(keys)})
    key = table.column_names
    codes = np.asarray(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)),
                       dtype=np.int64)
    engine = FirstRow() if first_row else Deduplicate()
    numpy_order, native_order = both(lambda: unique_run_order(table, key, codes, engine))
    if numpy_order is not None:
        assert isinstance(native_order, np.ndarray)
        np.testing.assert_array_equal(native_order, numpy_order)
        return
    # numpy gives up on keys without a fixed-width image (variable-length text); the native
    # order must then be exactly what deduplicating each group gives.
    if native_order is None:
        return
    assert isinstance(native_order, np.ndarray)
    # Views as their base types: Arrow's filter has no kernels for views (the order is the
    # same either way).
    plain = pa.table({name: c.cast(pa.string()) if pa.types.is_string_view(c.type) else
                      c.cast(pa.binary()) if pa.types.is_binary_view(c.type) else c
                      for name, c in zip(table.column_names, table.columns, strict=True)})
    rows = plain.append_column("_g", pa.array(codes)).append_column(
        "_i", pa.array(np.arange(n, dtype=np.int64)))
    ordered = take_rows(rows, pa.array(native_order))
    assert ordered["_g"].to_pylist() == sorted(codes.tolist())
    for group in sorted(set(codes.tolist())):
        mine = rows.filter(pa.compute.equal(rows["_g"], group))
        expected = dedupe_within_write(mine, key, engine)
        got = ordered.filter(pa.compute.equal(ordered["_g"], group))
        assert got["_i"].to_pylist() == expected["_i"].to_pylist()


def test_null_keys_are_refused_alike() -> None:
    table = pa.table({"id": pa.array([1, None], pa.int64()), "_seq": pa.array([1, 2])})
    numpy_error, native_error = both(lambda: Deduplicate().merge(table, ["id"]))
    assert numpy_error == native_error
    assert numpy_error[0].__name__ == "ValidationError"  # type: ignore[index]


def test_float_keys_keep_the_numpy_path() -> None:
    table = pa.table({"f": pa.array([0.0, -0.0, 1.5]), "v": [1, 2, 3], "_seq": [1, 2, 3]})
    numpy_result, native_result = both(lambda: Deduplicate().merge(table, ["f"]))
    _same(numpy_result, native_result)
    assert native_result.num_rows == 2  # type: ignore[union-attr]


def test_decimal_sums_of_runs_alike() -> None:
    table = pa.table({"id": ["a", "a", "b"], "d": pa.array([Decimal("1.10"), Decimal("2.05"),
                                                           None], pa.decimal128(5, 2)),
                      "_row_kind": pa.array([0, 1, 0], pa.int8()), "_seq": [1, 2, 3]})
    numpy_result, native_result = both(
        lambda: Aggregation({"d": "sum"}).merge(table, ["id"]))
    _same(numpy_result, native_result)
