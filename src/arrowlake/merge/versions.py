"""Ordering the versions of each primary key: the sort every merge engine starts from.

Rows of a bucket arrive as several sorted runs concatenated. :func:`group_versions` sorts them by
key and, within a key, from the oldest version to the newest, and finds where each key's versions
begin.
Engines then reduce each key's versions with whole-array operations (``numpy`` ``reduceat`` over
the group boundaries, Arrow ``take``), never a Python loop over rows; engines that keep one
version per key ask :func:`winners` for it instead.

Sorting is the cost that matters, and it is the native core's
(:func:`arrowlake.native.group_versions`, :func:`arrowlake.native.winners`): runs are already
sorted by key, so a stable sort that finds the runs merges them in near-linear time, without the
GIL. Floating-point keys (which tables refuse, but the engines take) compare as numbers with
``-0.0`` equal to ``0.0`` and every NaN equal to every other, above ``+inf``.

:func:`sortable_key` is another thing: one numpy array per row that orders like the key (the
integers themselves, or fixed-width byte strings), the image the key index keeps.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake import native
from arrowlake.errors import ColumnNotFound, ValidationError

ROW_KIND = "_row_kind"
"""Name of the int8 row-kind column (see :class:`RowKind`)."""

SEQUENCE = "_seq"
"""Name of the int64 column ordering versions globally: larger is newer."""

SYSTEM_COLUMNS = (ROW_KIND, SEQUENCE)


class RowKind(enum.IntEnum):
    """The change a row carries. ``-U`` and ``-D`` retract a row, ``+I`` and ``+U`` add one."""

    INSERT = 0  # +I
    UPDATE_BEFORE = 1  # -U
    UPDATE_AFTER = 2  # +U
    DELETE = 3  # -D
    RESTART = 4
    """Internal, never accepted from users: an addition that replaces every older version of its
    key. Partial-update and aggregation write it where a retraction is followed by additions
    inside one run, so the run still says "start over" to the older runs it is merged with."""


@dataclass(frozen=True, eq=False)
class KeyVersions:
    """The versions of every key of a table, oldest first.

    ``order`` holds row indices of the table sorted by key and, within a key, from the oldest to
    the newest version. Key ``g`` (the ``g``-th smallest) owns ``order[starts[g]:ends[g]]``.
    Positions below mean positions in ``order``.
    """

    order: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.order)

    @property
    def num_keys(self) -> int:
        return len(self.starts)

    @property
    def all_unique(self) -> bool:
        """Whether every key has exactly one version (nothing to merge)."""
        return self.num_keys == self.num_rows

    @property
    def sizes(self) -> np.ndarray:
        return np.asarray(self.ends - self.starts)

    def first_rows(self) -> np.ndarray:
        return np.asarray(self.order[self.starts])

    def last_rows(self) -> np.ndarray:
        return np.asarray(self.order[self.ends - 1])

    def sorted(self, values: np.ndarray) -> np.ndarray:
        """Per-row values of the table rearranged into position order."""
        return np.asarray(values[self.order])

    def per_position(self, per_key: np.ndarray) -> np.ndarray:
        """Broadcast one value per key to every position of that key."""
        return np.repeat(per_key, self.sizes)

    def last_where(self, mask: np.ndarray) -> np.ndarray:
        """The last position of each key where ``mask`` (by position) holds; -1 where none does."""
        if self.num_rows == 0:
            return np.empty(0, np.int64)
        positions = np.where(mask, np.arange(self.num_rows, dtype=np.int64), -1)
        return np.maximum.reduceat(positions, self.starts)

    def first_where(self, mask: np.ndarray) -> np.ndarray:
        """The first position of each key where ``mask`` (by position) holds; -1 where none does."""
        if self.num_rows == 0:
            return np.empty(0, np.int64)
        n = self.num_rows
        positions = np.where(mask, np.arange(n, dtype=np.int64), n)
        first = np.minimum.reduceat(positions, self.starts)
        first[first == n] = -1
        return first

    def count_where(self, mask: np.ndarray) -> np.ndarray:
        if self.num_rows == 0:
            return np.empty(0, np.int64)
        return np.add.reduceat(mask.astype(np.int64), self.starts)

    def rows_at(self, positions: np.ndarray) -> pa.Array:
        """Table row indices for positions, null where the position is -1 (for ``take``)."""
        missing = positions < 0
        rows = self.order[np.where(missing, 0, positions)] if self.num_rows else positions
        return pa.array(rows, pa.int64(), mask=missing if missing.any() else None)


def group_versions(
    table: pa.Table,
    key: Sequence[str],
    sequence_field: str | None = None,
    seq: np.ndarray | None = None,
) -> KeyVersions:
    """Sort the rows of ``table`` by key, then from oldest to newest version.

    Versions are ordered by ``sequence_field`` (nulls oldest) when given, then by ``seq`` (the
    ``_seq`` column by default, the row position when ``table`` has none), then by input
    position. One call of the native kernel (:func:`arrowlake.native.group_versions`).
    """
    n = table.num_rows
    key_columns = kernel_keys(table, key)
    if seq is None:
        seq = _sequence(table)
    if n == 0:
        empty = np.empty(0, np.int64)
        return KeyVersions(empty, empty, empty)
    field = _sequence_column(table, sequence_field)
    order, starts = native.group_versions(key_columns, field, seq)
    if len(starts) < n:
        _require_sequence_field(table, sequence_field)
    return KeyVersions(order, starts, np.append(starts[1:], n).astype(np.int64))


def winners(table: pa.Table, key: Sequence[str], sequence_field: str | None = None, *,
            oldest: bool = False) -> np.ndarray:
    """The row of each key's newest version (with ``oldest``, its oldest), in key order: the
    last (first) row of each key in :func:`group_versions`' order, found without ordering
    every key's versions (what deduplicate and first-row keep). One native call."""
    key_columns = kernel_keys(table, key)
    n = table.num_rows
    if n == 0:
        return np.empty(0, np.int64)
    rows = native.winners(key_columns, _sequence_column(table, sequence_field),
                          _sequence(table), oldest=oldest)
    if len(rows) < n:
        _require_sequence_field(table, sequence_field)
    return rows


def kernel_keys(table: pa.Table, key: Sequence[str]) -> list[pa.Array]:
    """The key columns for the native kernels: present, never null, of a type they sort.
    Views stay views (the kernels read them as they are)."""
    if not key:
        raise ValidationError("A primary-key merge needs at least one key column")
    columns = [_key_column(table, name, keep_views=True) for name in key]
    for name, column in zip(key, columns, strict=True):
        if not native.sortable(column.type):
            raise ValidationError(
                f"Column '{name}' of type {column.type} cannot be part of a primary key: key "
                "columns must be integers, floats, booleans, dates, times, timestamps, "
                "durations, decimals, strings or binaries")
    return columns


def _sequence_column(table: pa.Table, sequence_field: str | None) -> pa.Array | None:
    """The sequence field's column, or None without one (or when the data lacks it: see
    :func:`_require_sequence_field`)."""
    if sequence_field is None or sequence_field not in table.column_names:
        return None
    return table[sequence_field].combine_chunks()


def _require_sequence_field(table: pa.Table, sequence_field: str | None) -> None:
    """Refuse versions to order by a sequence field the data does not hold (data whose every
    key has one version needs none)."""
    if sequence_field is not None and sequence_field not in table.column_names:
        raise ColumnNotFound(
            f"Sequence field '{sequence_field}' is not in the data; "
            f"columns are {table.column_names}")


def sortable_key(table: pa.Table, key: Sequence[str]) -> np.ndarray | None:
    """The key of every row as one numpy array that orders and compares like the key columns
    in turn (what the sorts here use), or None for keys without such a form."""
    return _memcomparable([_key_column(table, name) for name in key])


def sort_by_key(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """``table`` sorted by its key columns (stable: equal keys keep their input order).

    >>> import pyarrow as pa
    >>> sort_by_key(pa.table({"id": [3, 1, 2]}), ["id"])["id"].to_pylist()
    [1, 2, 3]
    """
    if table.num_rows == 0:
        return table
    key_columns = [_key_column(table, name) for name in key]
    sortable = _memcomparable(key_columns)
    if sortable is not None:
        if _strictly_increasing(sortable) or bool(np.all(sortable[1:] >= sortable[:-1])):
            return table
        return take_rows(table, np.argsort(sortable, kind="stable"))
    keys_table = pa.table({f"k{i}": c for i, c in enumerate(key_columns)})
    return take_rows(
        table,
        pc.sort_indices(keys_table, sort_keys=[(f"k{i}", "ascending") for i in range(len(key))]),
    )


def row_kinds(table: pa.Table) -> np.ndarray:
    """The row kinds of ``table`` as int8 (all ``+I`` when it has no row-kind column)."""
    if ROW_KIND not in table.column_names:
        return np.zeros(table.num_rows, np.int8)
    column = table[ROW_KIND]
    if column.null_count:
        raise ValidationError(f"Column '{ROW_KIND}' may not be null: {column.null_count} null rows")
    kinds = _to_numpy(column).astype(np.int8, copy=False)
    if len(kinds) and (kinds.min() < 0 or kinds.max() > RowKind.RESTART):
        bad = int(np.count_nonzero((kinds < 0) | (kinds > RowKind.RESTART)))
        raise ValidationError(
            f"Column '{ROW_KIND}' holds {bad} values outside 0..4 "
            "(0 = +I, 1 = -U, 2 = +U, 3 = -D, 4 = internal restart)"
        )
    return kinds


def take(
    column: pa.Array | pa.ChunkedArray, indices: pa.Array | np.ndarray
) -> pa.Array | pa.ChunkedArray:
    """``column.take(indices)``, also for string/binary views (pyarrow has no take for those)."""
    base = _view_base(column.type)
    if base is None:
        return column.take(indices)
    return column.cast(base).take(indices).cast(column.type)


def take_rows(table: pa.Table, indices: pa.Array | np.ndarray) -> pa.Table:
    """``table.take(indices)``, also for tables with string/binary view columns."""
    if not any(_view_base(f.type) is not None for f in table.schema):
        return table.take(indices)
    return pa.Table.from_arrays([take(c, indices) for c in table.columns], schema=table.schema)


def _view_base(kind: pa.DataType) -> pa.DataType | None:
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    return None


def is_retraction(kinds: np.ndarray) -> np.ndarray:
    return np.asarray((kinds == RowKind.UPDATE_BEFORE) | (kinds == RowKind.DELETE))


def _sequence(table: pa.Table) -> np.ndarray:
    if SEQUENCE not in table.column_names:
        return np.arange(table.num_rows, dtype=np.int64)
    column = table[SEQUENCE]
    if column.null_count:
        raise ValidationError(f"Column '{SEQUENCE}' may not be null: {column.null_count} null rows")
    return _to_numpy(column).astype(np.int64, copy=False)


def _key_column(table: pa.Table, name: str, *, keep_views: bool = False) -> pa.Array:
    if name not in table.column_names:
        raise ColumnNotFound(
            f"Primary-key column '{name}' is not in the data; columns are {table.column_names}"
        )
    column = table[name].combine_chunks()
    if column.null_count:
        raise ValidationError(
            f"Column '{name}' is part of the primary key and may not be null: "
            f"{column.null_count} null rows"
        )
    if keep_views:
        return column
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.string())
    elif pa.types.is_binary_view(column.type):
        column = column.cast(pa.binary())
    return column


def _to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.to_numpy(zero_copy_only=False))


def _integer_view(column: pa.Array) -> np.ndarray | None:
    """The column as a numpy integer array ordered like the column, or None."""
    kind = column.type
    if pa.types.is_integer(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.uint8)
    if (
        pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_time(kind)
        or pa.types.is_duration(kind)
    ):
        return np.asarray(
            column.view(pa.int32() if kind.bit_width == 32 else pa.int64()).to_numpy()
        )
    return None


def _byte_matrix(column: pa.Array) -> np.ndarray | None:
    """A (rows, width) uint8 matrix whose rows compare (memcmp) like the column, or None."""
    ints = _integer_view(column)
    if ints is not None:
        big_endian = ints.astype(ints.dtype.newbyteorder(">"))
        matrix = big_endian.view(np.uint8).reshape(len(ints), ints.dtype.itemsize).copy()
        if ints.dtype.kind == "i":
            matrix[:, 0] ^= 0x80  # two's complement -> offset binary, so negatives sort first
        return matrix
    kind = column.type
    n = len(column)
    if pa.types.is_fixed_size_binary(kind):
        width = kind.byte_width
        data = np.frombuffer(column.buffers()[1], np.uint8)
        start = column.offset * width
        return data[start : start + n * width].reshape(n, width)
    offset_type: type[np.signedinteger[typing.Any]]
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        offset_type = np.int32
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        offset_type = np.int64
    else:
        return None
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], offset_type)[column.offset : column.offset + n + 1]
    lengths = np.diff(offsets)
    if n == 0:
        return None  # no width to take from an empty column
    width = int(lengths[0])
    # Only equal-length values (UUIDs, fixed codes) are a zero-copy reshape of the data buffer;
    # variable-length ones go to Arrow's sort instead of padding every value.
    if width == 0 or not bool(np.all(lengths == width)):
        return None
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    first = int(offsets[0])
    return data[first : first + n * width].reshape(n, width)


def _memcomparable(columns: Sequence[pa.Array]) -> np.ndarray | None:
    """One numpy array ordered and compared like the composite key, or None if not possible."""
    if len(columns) == 1:
        ints = _integer_view(columns[0])
        if ints is not None:
            return ints
    matrices = []
    for column in columns:
        matrix = _byte_matrix(column)
        if matrix is None:
            return None
        matrices.append(matrix)
    matrix = np.ascontiguousarray(np.hstack(matrices) if len(matrices) > 1 else matrices[0])
    # Same-width byte strings compare like memcmp, so this orders like the key columns in turn.
    return matrix.view(f"S{matrix.shape[1]}").ravel()


def _strictly_increasing(values: np.ndarray) -> bool:
    return bool(np.all(values[1:] > values[:-1]))
