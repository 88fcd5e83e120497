"""Whether two rows hold the same stored values: what decides that a key written again
"changed nothing".

Merge-on-write writes a merged row only where it differs from the key's live row, and every
change stream (deletion-vector snapshots, the ``lookup`` changelog, catch-up's net change)
drops a ``-U``/``+U`` pair whose two rows are the same. All of them ask :func:`same_values`,
so one value is "unchanged" everywhere:

- nulls equal nulls (at any depth) and nothing else; the null type is always equal;
- floating-point values are equal when their bits are (so ``-0.0`` differs from ``0.0``: both
  are kept as written, and a reader sees which one it got) or when both are NaN (whatever the
  payload: NaN is one value to arrowlake, as to Arrow's sorts and Parquet);
- structs, lists (large, fixed-size, views) and maps by value, element by element, lengths
  first; dictionaries by their values; extension types by their storage;
- every other type by Arrow's ``equal`` kernel, or byte for byte where it has none
  (fixed-width types such as intervals).

Vectorized throughout: nested values are compared on their flattened children, and each
list row's verdict is gathered from its elements with one ``bincount``.

>>> import pyarrow as pa
>>> same_values(pa.array([[1.0, float("nan")], None, [0.0]]),
...             pa.array([[1.0, float("nan")], None, [-0.0]])).tolist()
[True, True, False]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def same_values(x: pa.Array | pa.ChunkedArray, y: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row of two aligned columns (same length, same or castable types): whether both hold
    the same stored value (see the module docstring), as a numpy bool array."""
    left, right = _whole(x), _whole(y)
    if len(left) != len(right):
        raise ValueError(f"cannot compare columns of {len(left)} and {len(right)} rows")
    if len(left) == 0:
        return np.ones(0, dtype=bool)
    left, right = _plain(left), _plain(right)
    if left.type != right.type and not pa.types.is_null(left.type) \
            and not pa.types.is_null(right.type):
        right = right.cast(left.type)
    return _equal(left, right)


def same_rows(before: pa.Table, after: pa.Table) -> np.ndarray:
    """Per aligned row pair of two tables with the same columns: whether every value is the
    same (:func:`same_values`, column by column)."""
    same = np.ones(before.num_rows, dtype=bool)
    for name in before.column_names:
        same &= same_values(before.column(name), after.column(name))
    return same


def _whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _plain(arr: pa.Array) -> pa.Array:
    """Extension arrays as their storage, dictionaries as their values (at the top level;
    children are unwrapped as they are reached)."""
    while True:
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        elif pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        else:
            return arr


def _valid(arr: pa.Array) -> np.ndarray | None:
    """The validity of ``arr`` as numpy, or None when no value is null."""
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), dtype=bool)
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _equal(x: pa.Array, y: pa.Array) -> np.ndarray:
    """Per row: both null, or both valid with equal values."""
    x, y = _plain(x), _plain(y)
    n = len(x)
    if pa.types.is_null(x.type) and pa.types.is_null(y.type):
        return np.ones(n, dtype=bool)
    vx, vy = _valid(x), _valid(y)
    if vx is None and vy is None:
        return _values_equal(x, y, np.ones(n, dtype=bool))
    if vx is None:
        vx = np.ones(n, dtype=bool)
    if vy is None:
        vy = np.ones(n, dtype=bool)
    both, neither = vx & vy, ~(vx | vy)
    if not both.any():  # also where one side is of the null type
        return neither
    return neither | (both & _values_equal(x, y, both))


def _values_equal(x: pa.Array, y: pa.Array, valid: np.ndarray) -> np.ndarray:
    """Per row: whether the values are equal, meaningful only where ``valid`` (both sides
    hold a value); x and y have the same type."""
    typ = x.type
    t = pa.types
    if t.is_floating(typ):
        return _floats_equal(x, y)
    if t.is_struct(typ):
        same = np.ones(len(x), dtype=bool)
        for i in range(typ.num_fields):
            same &= _equal(x.field(i), y.field(i))
        return same
    if t.is_map(typ):
        entries = pa.list_(pa.field("entries", pa.struct([typ.key_field, typ.item_field]),
                                    nullable=False))
        return _lists_equal(x.cast(entries), y.cast(entries), valid)
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ) \
            or t.is_list_view(typ) or t.is_large_list_view(typ):
        return _lists_equal(x, y, valid)
    try:
        eq = pc.equal(x, y)
    except pa.ArrowNotImplementedError:
        return _bytes_equal(x, y)
    return np.asarray(pc.fill_null(eq, False).to_numpy(zero_copy_only=False), dtype=bool)


def _floats_equal(x: pa.Array, y: pa.Array) -> np.ndarray:
    a = np.asarray(x.to_numpy(zero_copy_only=False))
    b = np.asarray(y.to_numpy(zero_copy_only=False))
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return np.asarray((a.view(bits) == b.view(bits)) | (np.isnan(a) & np.isnan(b)))


def _lists_equal(x: pa.Array, y: pa.Array, valid: np.ndarray) -> np.ndarray:
    """Lists of any kind: equal lengths, then every element equal (compared once, on the
    flattened elements of the rows worth comparing)."""
    lx = np.asarray(pc.fill_null(pc.list_value_length(x), 0).to_numpy(zero_copy_only=False))
    ly = np.asarray(pc.fill_null(pc.list_value_length(y), 0).to_numpy(zero_copy_only=False))
    same = lx == ly
    compare = valid & same & (lx > 0)
    rows = np.flatnonzero(compare)
    if len(rows) == 0:
        return same
    if len(rows) < len(x):
        picked = pa.array(rows)
        x, y = x.take(picked), y.take(picked)
    elements = _equal(pc.list_flatten(x), pc.list_flatten(y))
    if elements.all():
        return same
    parents = np.asarray(pc.list_parent_indices(x).to_numpy(zero_copy_only=False))
    differing = np.bincount(parents[~elements], minlength=len(rows))
    same[rows[differing > 0]] = False
    return same


def _bytes_equal(x: pa.Array, y: pa.Array) -> np.ndarray:
    """Fixed-width values without a comparison kernel (intervals, ...), byte for byte; any
    other type without one counts as changed, so its rows are written and streamed, never
    lost."""
    typ = x.type
    try:
        width = typ.bit_width
    except ValueError:
        return np.zeros(len(x), dtype=bool)
    if width % 8 or len(x.buffers()) != 2:
        return np.zeros(len(x), dtype=bool)
    size = width // 8

    def matrix(arr: pa.Array) -> np.ndarray:
        data = np.frombuffer(arr.buffers()[1], np.uint8)
        return data[arr.offset * size:(arr.offset + len(arr)) * size].reshape(len(arr), size)

    return np.asarray((matrix(x) == matrix(y)).all(axis=1))


__all__ = ["same_rows", "same_values"]
