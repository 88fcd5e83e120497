"""Aggregate functions of the ``aggregation`` merge engine, one vectorized reduction per column.

Each function folds the versions of a key, oldest first, into one value. Every function must give
the same answer whether it folds raw rows or rows it produced itself (a compacted run is merged
again with newer runs), which is why ``count`` adds up stored counts instead of counting rows.

Retractions (``-U``/``-D`` rows) are supported by ``sum`` and ``count`` (they subtract), by
``last_value`` (a retraction clears the value, as in Paimon) and by ``last_non_null_value``
(retractions are skipped: unlike Paimon, which clears the value, because a cleared value in a
compacted run would read as "no value" and let an older one through); the other functions raise
unless the column is listed in ``ignore_retract``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ColumnNotFound, SchemaMismatch, ValidationError
from arrowlake.merge.versions import SYSTEM_COLUMNS, KeyVersions, take

DEFAULT_FUNCTION = "last_non_null_value"

RETRACTABLE = frozenset({"sum", "count", "last_value", "last_non_null_value"})


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _temporal(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
    )


def _stringish(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _binaryish(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def _orderable(t: pa.DataType) -> bool:
    return (
        _numeric(t) or _temporal(t) or _stringish(t) or _binaryish(t) or pa.types.is_boolean(t)
    ) and not pa.types.is_float16(t)


def _any(t: pa.DataType) -> bool:
    return True


# function -> (accepts the type?, what it accepts, for the error message)
FUNCTIONS = {
    "sum": (lambda t: _numeric(t) and not pa.types.is_float16(t), "numbers"),
    "count": (pa.types.is_int64, "int64"),
    "min": (_orderable, "numbers, dates, times, strings, binary or booleans"),
    "max": (_orderable, "numbers, dates, times, strings, binary or booleans"),
    "last_value": (_any, "any type"),
    "last_non_null_value": (_any, "any type"),
    "first_value": (_any, "any type"),
    "first_non_null_value": (_any, "any type"),
    "bool_and": (pa.types.is_boolean, "booleans"),
    "bool_or": (pa.types.is_boolean, "booleans"),
    "listagg": (_stringish, "strings"),
}


def validate_aggregations(
    schema: pa.Schema,
    key: Sequence[str],
    functions: Mapping[str, str],
    ignore_retract: Iterable[str] = (),
) -> None:
    """Check that every aggregate function names a value column of a type it can aggregate.

    >>> import pyarrow as pa
    >>> schema = pa.schema({"id": pa.int64(), "name": pa.string()})
    >>> validate_aggregations(schema, ["id"], {"name": "sum"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    arrowlake.errors.SchemaMismatch: Aggregate function 'sum' cannot aggregate column 'name' ...
    """
    for column, function in functions.items():
        if function not in FUNCTIONS:
            raise ValidationError(
                f"Unknown aggregate function '{function}' for column '{column}'; "
                f"valid functions are {', '.join(sorted(FUNCTIONS))}"
            )
        _check_column(schema, key, column, "an aggregate function")
        accepts, accepted = FUNCTIONS[function]
        column_type = schema.field(column).type
        if not accepts(column_type):
            raise SchemaMismatch(
                f"Aggregate function '{function}' cannot aggregate column '{column}' "
                f"of type {column_type}: it takes {accepted}"
            )
    for column in ignore_retract:
        _check_column(schema, key, column, "ignore-retract")


def _check_column(schema: pa.Schema, key: Sequence[str], column: str, what: str) -> None:
    if column in key:
        raise ValidationError(
            f"Column '{column}' is part of the primary key and cannot have {what}"
        )
    if column in SYSTEM_COLUMNS:
        raise ValidationError(f"Column '{column}' is a system column and cannot have {what}")
    if schema.get_field_index(column) < 0:
        raise ColumnNotFound(
            f"Column '{column}' given {what} is not in the table; columns are {schema.names}"
        )


def aggregate(
    function: str,
    name: str,
    column: pa.ChunkedArray,
    versions: KeyVersions,
    include: np.ndarray,
    retraction: np.ndarray,
) -> pa.Array | pa.ChunkedArray:
    """Fold ``column`` per key with ``function``: one value per key of ``versions``.

    ``include`` and ``retraction`` are by position: the versions that take part in the fold
    (after the last reset) and which of them are retractions.
    """
    retracting = include & retraction
    if function not in RETRACTABLE and retracting.any():
        raise ValidationError(
            f"Aggregate function '{function}' of column '{name}' cannot retract a value, "
            f"but {int(np.count_nonzero(retracting))} -U/-D rows reach it. Use a retractable "
            f"function ({', '.join(sorted(RETRACTABLE))}), or set "
            f"'fields.{name}.ignore-retract' to skip retractions for this column"
        )
    valid = versions.sorted(_validity(column))
    if function == "last_value":
        return _pick(column, versions, versions.last_where(include), retraction)
    if function == "last_non_null_value":
        return _pick(column, versions, versions.last_where(include & valid & ~retraction), None)
    if function == "first_value":
        return _pick(column, versions, versions.first_where(include), None)
    if function == "first_non_null_value":
        return _pick(column, versions, versions.first_where(include & valid), None)
    contributing = include & valid
    if function in ("sum", "count"):
        return _sum(column, versions, contributing, retraction, function == "count", name)
    if function in ("min", "max"):
        return _min_max(function, column, versions, contributing)
    if function in ("bool_and", "bool_or"):
        return _bool(function, column, versions, contributing)
    if function == "listagg":
        return _listagg(column, versions, contributing)
    raise ValidationError(f"Unknown aggregate function '{function}'")  # pragma: no cover


def _validity(column: pa.ChunkedArray) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _pick(
    column: pa.ChunkedArray,
    versions: KeyVersions,
    positions: np.ndarray,
    cleared_by: np.ndarray | None,
) -> pa.ChunkedArray:
    if cleared_by is not None and versions.num_rows:
        # Paimon's retract for last_value: the value is retracted to null.
        positions = np.where((positions >= 0) & cleared_by[np.maximum(positions, 0)], -1, positions)
    return take(column, versions.rows_at(positions))


def _sorted_values(column: pa.ChunkedArray, versions: KeyVersions) -> pa.Array:
    values = take(column, pa.array(versions.order, pa.int64()))
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _with_nulls(values: np.ndarray, present: np.ndarray) -> pa.Array:
    return pa.array(values, mask=~present if not present.all() else None)


def _sum(
    column: pa.ChunkedArray,
    versions: KeyVersions,
    contributing: np.ndarray,
    retraction: np.ndarray,
    count: bool,
    name: str,
) -> pa.Array:
    column_type = column.type
    if pa.types.is_decimal(column_type):
        return _decimal_sum(column, versions, contributing, retraction)
    values = _sorted_values(column, versions)
    if values.null_count:
        values = values.fill_null(pa.scalar(0, values.type))
    numbers = values.to_numpy(zero_copy_only=False)
    # Retractions subtract, so integers (unsigned too) add up as int64; the cast back checks range.
    accumulator: type[np.generic] = np.float64 if pa.types.is_floating(column_type) else np.int64
    signed = np.where(retraction, -1, 1).astype(accumulator)
    terms = np.where(contributing, numbers.astype(accumulator) * signed, 0)
    if versions.num_rows == 0:
        totals = np.empty(0, accumulator)
    else:
        totals = np.add.reduceat(terms, versions.starts)
    present = np.ones(len(totals), bool) if count else versions.count_where(contributing) > 0
    result = _with_nulls(totals, present)
    try:
        return result.cast(column_type)
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise ValidationError(
            f"The sum of column '{name}' does not fit its type {column_type}: {exc}"
        ) from exc


def _decimal_sum(
    column: pa.ChunkedArray,
    versions: KeyVersions,
    contributing: np.ndarray,
    retraction: np.ndarray,
) -> pa.Array:
    values = _sorted_values(column, versions)
    values = pc.if_else(pa.array(retraction), pc.negate(values), values)
    values = pc.if_else(pa.array(contributing), values, pa.scalar(None, values.type))
    group = np.repeat(np.arange(versions.num_keys, dtype=np.int64), versions.sizes)
    summed = (
        pa.table({"g": group, "v": values})
        .group_by("g", use_threads=False)
        .aggregate([("v", "sum")])
        .sort_by("g")
    )
    return summed["v_sum"].combine_chunks().cast(column.type)


def _min_max(
    function: str, column: pa.ChunkedArray, versions: KeyVersions, contributing: np.ndarray
) -> pa.Array:
    column_type = column.type
    present = versions.count_where(contributing) > 0
    values = _sorted_values(column, versions)
    numeric = (
        pa.types.is_integer(column_type)
        or pa.types.is_floating(column_type)
        or _temporal(column_type)
        or pa.types.is_boolean(column_type)
    )
    if numeric and versions.num_rows:
        numbers = _plain_numbers(values)
        reduce: np.ufunc
        if numbers.dtype.kind == "f":
            neutral = np.inf if function == "min" else -np.inf
            reduce = np.fmin if function == "min" else np.fmax  # NaN loses, as in Arrow's min/max
        else:
            limits = np.iinfo(numbers.dtype)
            neutral = limits.max if function == "min" else limits.min
            reduce = np.minimum if function == "min" else np.maximum
        reduced = _with_nulls(
            reduce.reduceat(np.where(contributing, numbers, neutral), versions.starts), present
        )
        return reduced.view(column_type) if _temporal(column_type) else reduced.cast(column_type)
    return _min_max_pairwise(function, column, versions, contributing)


def _plain_numbers(values: pa.Array) -> np.ndarray:
    """Integers, floats, booleans (as uint8) or temporals (as their integers), nulls as 0."""
    kind = values.type
    if _temporal(kind):
        values = pa.Array.from_buffers(
            pa.int32() if kind.bit_width == 32 else pa.int64(),
            len(values),
            values.buffers(),
            offset=values.offset,
        )
    elif pa.types.is_boolean(kind):
        values = values.cast(pa.uint8())
    return np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False))


def _min_max_pairwise(
    function: str, column: pa.ChunkedArray, versions: KeyVersions, contributing: np.ndarray
) -> pa.Array:
    """min/max for strings, binary and decimals, without a hash table.

    Keys with one version take it as is; the versions of the others are reduced by pairwise
    element-wise min/max, doubling the span each pass (log2 of the most versions a key has).
    """
    column_type = column.type
    if pa.types.is_string_view(column_type) or pa.types.is_binary_view(column_type):
        column = column.cast(pa.string() if _stringish(column_type) else pa.binary())
    first = np.where(contributing[versions.starts], versions.starts, -1)
    result = column.take(versions.rows_at(first))
    result = result.combine_chunks() if isinstance(result, pa.ChunkedArray) else result
    several = versions.sizes > 1
    if several.any():
        sizes = versions.sizes[several]
        subset = np.flatnonzero(versions.per_position(several))
        sub_starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        sub_ends = sub_starts + sizes
        values = column.take(pa.array(versions.order[subset], pa.int64()))
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if not contributing[subset].all():
            values = pc.if_else(
                pa.array(contributing[subset]), values, pa.scalar(None, values.type)
            )
        combine = pc.min_element_wise if function == "min" else pc.max_element_wise
        positions = np.arange(len(subset), dtype=np.int64)
        group_end = np.repeat(sub_ends, sizes)
        step = 1
        while step < int(sizes.max()):
            partner = positions + step
            values = combine(values, values.take(np.where(partner < group_end, partner, positions)))
            step *= 2
        result = pc.replace_with_mask(result, pa.array(several), values.take(sub_starts))
    return result.cast(column_type)


def _bool(
    function: str, column: pa.ChunkedArray, versions: KeyVersions, contributing: np.ndarray
) -> pa.Array:
    present = versions.count_where(contributing) > 0
    if versions.num_rows == 0:
        return pa.array([], pa.bool_())
    values = _sorted_values(column, versions).fill_null(False).to_numpy(zero_copy_only=False)
    values = np.asarray(values, dtype=bool)
    if function == "bool_and":
        reduced = np.logical_and.reduceat(np.where(contributing, values, True), versions.starts)
    else:
        reduced = np.logical_or.reduceat(np.where(contributing, values, False), versions.starts)
    return _with_nulls(reduced, present)


def _listagg(column: pa.ChunkedArray, versions: KeyVersions, contributing: np.ndarray) -> pa.Array:
    column_type = column.type
    counts = versions.count_where(contributing)
    rows = versions.order[contributing]
    if pa.types.is_string_view(column_type):
        column = column.cast(pa.string())
    values = column.take(pa.array(rows, pa.int64()))
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    offsets = np.concatenate(([0], np.cumsum(counts)))
    if pa.types.is_large_string(values.type):
        lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    else:
        lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values)
    joined = pc.binary_join(lists, pa.scalar(",", values.type))
    joined = pc.if_else(pa.array(counts > 0), joined, pa.scalar(None, joined.type))
    return joined.cast(column_type)
