"""Merge engines: how the versions of one primary key become the row a reader sees.

Every engine takes the rows of several sorted runs (user columns plus ``_row_kind`` and ``_seq``)
and returns one row per surviving key, sorted by key, with the same columns. Versions of a key are
ordered by the table's ``sequence_field`` when it has one (nulls oldest), then by ``_seq``.

``keep_retractions`` decides what happens to a key whose final state is "deleted": with False (a
read, or a compaction that includes the oldest run) the key is dropped; with True (a compaction of
newer runs only) the key keeps a ``-D`` row so that it still shadows the runs left out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake import native
from arrowlake.errors import ValidationError
from arrowlake.merge.aggregation import (
    DEFAULT_FUNCTION,
    FUNCTIONS,
    RETRACTABLE,
    aggregate,
    validate_aggregations,
)
from arrowlake.merge.bucketing import bucket_of, check_hashable
from arrowlake.merge.versions import (
    ROW_KIND,
    SEQUENCE,
    SYSTEM_COLUMNS,
    KeyVersions,
    RowKind,
    group_versions,
    is_retraction,
    kernel_keys,
    row_kinds,
    take,
    take_rows,
    winners,
)


@dataclass(frozen=True)
class MergeEngine(ABC):
    """Base class: how the versions of a primary key merge into one row."""

    name = "deduplicate"

    def merge(
        self,
        table: pa.Table,
        key: Sequence[str],
        sequence_field: str | None = None,
        keep_retractions: bool = False,
        *,
        constant: Sequence[str] = (),
    ) -> pa.Table:
        """Merge the versions of each key of ``table``: one row per surviving key, by key.

        ``table`` needs the ``_seq`` column; without ``_row_kind`` every row is an insert.
        ``constant`` names key columns known to hold one value throughout ``table`` (partition
        columns within a bucket): they are left out of the sort.
        """
        if SEQUENCE not in table.column_names:
            raise ValidationError(
                f"Merging versions needs the '{SEQUENCE}' column; columns are {table.column_names}"
            )
        return self._merge(table, list(key), sequence_field, keep_retractions,
                           _sort_key(key, constant))

    @abstractmethod
    def _merge(
        self,
        table: pa.Table,
        key: list[str],
        sequence_field: str | None,
        keep_retractions: bool,
        sort_key: list[str],
    ) -> pa.Table:
        """Each engine's reduction of the versions (``merge`` checks the input first)."""


@dataclass(frozen=True)
class Deduplicate(MergeEngine):
    """The newest version of each key wins; a retraction as the newest version deletes the key.

    ``ignore_delete`` drops every ``-U``/``-D`` row first, so deletes never remove a key.

    >>> import pyarrow as pa
    >>> rows = pa.table({"id": [1, 1, 2], "v": ["a", "b", "c"],
    ...                  "_row_kind": pa.array([0, 2, 3], pa.int8()), "_seq": [1, 2, 3]})
    >>> Deduplicate().merge(rows, ["id"]).to_pydict()["v"]
    ['b']
    """

    ignore_delete: bool = False
    name = "deduplicate"

    def _merge(
        self,
        table: pa.Table,
        key: list[str],
        sequence_field: str | None,
        keep_retractions: bool,
        sort_key: list[str],
    ) -> pa.Table:
        kinds = row_kinds(table)
        if self.ignore_delete:
            table, kinds = _drop_retractions(table, kinds)
        newest = winners(table, sort_key, sequence_field)
        return _finish(table, kinds, newest, keep_retractions, len(newest) == table.num_rows)


@dataclass(frozen=True)
class FirstRow(MergeEngine):
    """The oldest version of each key is kept and later ones are ignored, retractions included.

    >>> import pyarrow as pa
    >>> rows = pa.table({"id": [1, 1], "v": ["a", "b"],
    ...                  "_row_kind": pa.array([0, 0], pa.int8()), "_seq": [1, 2]})
    >>> FirstRow().merge(rows, ["id"]).to_pydict()["v"]
    ['a']
    """

    name = "first-row"

    def _merge(
        self,
        table: pa.Table,
        key: list[str],
        sequence_field: str | None,
        keep_retractions: bool,
        sort_key: list[str],
    ) -> pa.Table:
        table, kinds = _drop_retractions(table, row_kinds(table))
        oldest = winners(table, sort_key, sequence_field, oldest=True)
        return _finish(table, kinds, oldest, False, len(oldest) == table.num_rows)


@dataclass(frozen=True)
class PartialUpdate(MergeEngine):
    """Each non-key column takes its newest non-null value since the key was last retracted.

    A ``-U``/``-D`` resets the row (older values are forgotten) and, as the newest version, deletes
    the key. With ``ignore_delete`` retractions are skipped altogether.

    Where a retraction is followed by additions and ``keep_retractions`` is set (one write, or a
    compaction of newer runs only), the merged row gets the internal kind ``RESTART`` so that it
    still hides the values of the older runs it is later merged with.

    Limitation with a ``sequence_field``: a merged row carries the newest sequence value of the
    versions it combines, so a version arriving later with a value between them is ordered
    against the combined row, not against the versions (a restart then also hides a late
    version whose value lies between the retraction and the addition).

    >>> import pyarrow as pa
    >>> rows = pa.table({"id": [1, 1], "a": [1, None], "b": [None, "x"],
    ...                  "_row_kind": pa.array([0, 2], pa.int8()), "_seq": [1, 2]})
    >>> PartialUpdate().merge(rows, ["id"]).select(["a", "b"]).to_pylist()
    [{'a': 1, 'b': 'x'}]
    """

    ignore_delete: bool = False
    name = "partial-update"

    def _merge(
        self,
        table: pa.Table,
        key: list[str],
        sequence_field: str | None,
        keep_retractions: bool,
        sort_key: list[str],
    ) -> pa.Table:
        kinds = row_kinds(table)
        if self.ignore_delete:
            table, kinds = _drop_retractions(table, kinds)
        versions = group_versions(table, sort_key, sequence_field)
        if versions.all_unique:
            return _finish(table, kinds, versions.last_rows(), keep_retractions, True)
        retraction = versions.sorted(is_retraction(kinds))
        segment = _Segments.after_last(versions, retraction, versions.sorted(_restarts(kinds)))
        columns = {}
        for name in table.column_names:
            column = table[name]
            if name in key or name in SYSTEM_COLUMNS or column.null_count == 0:
                # Without nulls the newest version of the segment is the newest of the key.
                positions = versions.ends - 1
            else:
                valid = versions.sorted(
                    np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                )
                positions = versions.last_where(valid & segment.include)
                positions = np.where(segment.deleted, versions.ends - 1, positions)
            columns[name] = (column, positions)
        return _assemble(table, kinds, versions, columns, segment, keep_retractions)


@dataclass(frozen=True)
class Aggregation(MergeEngine):
    """Each non-key column is folded over the versions of its key by an aggregate function.

    ``functions`` maps columns to ``sum``, ``min``, ``max``, ``count``, ``last_value``,
    ``last_non_null_value``, ``first_value``, ``first_non_null_value``, ``bool_and``,
    ``bool_or`` or ``listagg``; other columns use ``default_function``.

    Retractions (``-U``/``-D``), as in Paimon: ``sum`` and ``count`` subtract the retracted
    value; ``last_value`` clears it; ``last_non_null_value`` skips retractions; other functions
    raise :class:`~arrowlake.errors.ValidationError` unless their column is in ``ignore_retract``.
    A retraction never removes the key, unless ``remove_record_on_delete``: then a ``-D`` resets
    every column and, as the newest version, deletes the key.

    ``count`` is compaction-safe: the int64 column holds how many things a row counts (1 for a
    fresh row, a running count in a merged one); the merge adds them up, null counting as 0.

    >>> import pyarrow as pa
    >>> rows = pa.table({"id": [1, 1, 1], "n": [5, 7, 5],
    ...                  "_row_kind": pa.array([0, 0, 1], pa.int8()), "_seq": [1, 2, 3]})
    >>> Aggregation({"n": "sum"}).merge(rows, ["id"])["n"].to_pylist()
    [7]
    """

    functions: Mapping[str, str] = field(default_factory=dict, hash=False)
    default_function: str = DEFAULT_FUNCTION
    ignore_retract: frozenset[str] = frozenset()
    remove_record_on_delete: bool = False
    name = "aggregation"

    def __post_init__(self) -> None:
        object.__setattr__(self, "functions", dict(self.functions))
        object.__setattr__(self, "ignore_retract", frozenset(self.ignore_retract))
        for function in (*self.functions.values(), self.default_function):
            if function not in FUNCTIONS:
                raise ValidationError(
                    f"Unknown aggregate function '{function}'; "
                    f"valid functions are {', '.join(sorted(FUNCTIONS))}"
                )

    def function_of(self, column: str) -> str:
        return self.functions.get(column, self.default_function)

    def validate(self, schema: pa.Schema, key: Sequence[str]) -> None:
        """Check the functions against a table schema (see :func:`validate_aggregations`)."""
        defaulted = {
            name: self.default_function
            for name in schema.names
            if name not in key and name not in SYSTEM_COLUMNS and name not in self.functions
        }
        validate_aggregations(schema, key, {**defaulted, **self.functions}, self.ignore_retract)

    def _merge(
        self,
        table: pa.Table,
        key: list[str],
        sequence_field: str | None,
        keep_retractions: bool,
        sort_key: list[str],
    ) -> pa.Table:
        kinds = row_kinds(table)
        if not self.remove_record_on_delete and _restarts(kinds).any():
            # Without resets there is nothing for a restart to hide: a plain addition.
            kinds = np.where(_restarts(kinds), RowKind.UPDATE_AFTER, kinds).astype(np.int8)
            table = _set_row_kind(table, kinds)
        retractions = is_retraction(kinds)
        versions = group_versions(table, sort_key, sequence_field)
        if versions.all_unique and not retractions.any():
            # One insert-only version per key folds to itself under every function, except
            # that a count is never null: a null counts as 0 wherever versions are added up.
            merged = _finish(table, kinds, versions.last_rows(), keep_retractions, True)
            for name in merged.column_names:
                if (name not in key and name not in SYSTEM_COLUMNS
                        and self.function_of(name) == "count" and merged[name].null_count):
                    index = merged.column_names.index(name)
                    merged = merged.set_column(index, merged.schema.field(index),
                                               pc.fill_null(merged[name], 0))
            return merged
        retraction = versions.sorted(retractions)
        if self.remove_record_on_delete:
            segment = _Segments.after_last(versions, versions.sorted(kinds == RowKind.DELETE),
                                           versions.sorted(_restarts(kinds)))
        else:
            segment = _Segments.everything(versions)
        columns = {}
        for name in table.column_names:
            column = table[name]
            if name in key or name in SYSTEM_COLUMNS:
                columns[name] = (column, versions.ends - 1)
                continue
            include = segment.include
            if name in self.ignore_retract:
                include = include & ~retraction
            merged = aggregate(self.function_of(name), name, column, versions, include, retraction)
            if segment.deleted.any():
                # A deleted key keeps its tombstone's own values.
                merged = _keep_tombstones(column, merged, versions, segment.deleted)
            columns[name] = merged
        return _assemble(table, kinds, versions, columns, segment, keep_retractions)


ENGINES: dict[str, type[MergeEngine]] = {
    "deduplicate": Deduplicate,
    "partial-update": PartialUpdate,
    "aggregation": Aggregation,
    "first-row": FirstRow,
}


def engine_from_options(
    name: str,
    schema: pa.Schema,
    key: Sequence[str],
    options: Mapping[str, str | bool] | None = None,
) -> MergeEngine:
    """Build the merge engine a table's options describe, checked against its schema.

    Options use Paimon's names: ``ignore-delete`` (deduplicate, partial-update),
    ``fields.<column>.aggregate-function``, ``fields.default-aggregate-function``,
    ``fields.<column>.ignore-retract`` and ``aggregation.remove-record-on-delete``.
    Other options are ignored (they belong to the table).

    >>> import pyarrow as pa
    >>> schema = pa.schema({"id": pa.int64(), "n": pa.int64()})
    >>> engine = engine_from_options("aggregation", schema, ["id"],
    ...                              {"fields.n.aggregate-function": "sum"})
    >>> engine.functions
    {'n': 'sum'}
    """
    options = dict(options or {})
    if name not in ENGINES:
        raise ValidationError(
            f"Unknown merge engine '{name}'; valid engines are {', '.join(ENGINES)}"
        )
    if name == "deduplicate":
        return Deduplicate(ignore_delete=_flag(options, "ignore-delete"))
    if name == "first-row":
        return FirstRow()
    if name == "partial-update":
        ignore = _flag(options, "ignore-delete") or _flag(options, "partial-update.ignore-delete")
        return PartialUpdate(ignore_delete=ignore)
    functions: dict[str, str] = {}
    ignore_retract: set[str] = set()
    for option, value in options.items():
        parts = option.split(".")
        if len(parts) < 3 or parts[0] != "fields":
            continue
        column = ".".join(parts[1:-1])
        if parts[-1] == "aggregate-function":
            functions[column] = str(value)
        elif parts[-1] == "ignore-retract" and _flag(options, option):
            ignore_retract.add(column)
    engine = Aggregation(
        functions=functions,
        default_function=str(options.get("fields.default-aggregate-function", DEFAULT_FUNCTION)),
        ignore_retract=frozenset(ignore_retract),
        remove_record_on_delete=_flag(options, "aggregation.remove-record-on-delete"),
    )
    engine.validate(schema, key)
    return engine


def dedupe_within_write(
    table: pa.Table,
    key: Sequence[str],
    engine: MergeEngine | None = None,
    sequence_field: str | None = None,
    *,
    constant: Sequence[str] = (),
) -> pa.Table:
    """Resolve repeated keys inside one written batch so it can be written as one sorted run.

    Versions are ordered by ``sequence_field``, then by ``_seq`` if present, else by input
    position. Retractions are kept as ``-D`` rows (they must shadow older runs). The result is
    sorted by key with unique keys and the same columns.

    >>> import pyarrow as pa
    >>> batch = pa.table({"id": [2, 1, 2], "v": ["a", "b", "c"]})
    >>> dedupe_within_write(batch, ["id"]).to_pydict()
    {'id': [1, 2], 'v': ['b', 'c']}
    """
    engine = engine or Deduplicate()
    sort_key = _sort_key(key, constant)
    if SEQUENCE in table.column_names:
        return engine._merge(table, list(key), sequence_field, True, sort_key)
    positions = pa.array(np.arange(table.num_rows, dtype=np.int64))
    merged = engine._merge(
        table.append_column(SEQUENCE, positions), list(key), sequence_field, True, sort_key
    )
    return merged.drop_columns([SEQUENCE])


def unique_run_order(
    table: pa.Table,
    key: Sequence[str],
    groups: np.ndarray,
    engine: MergeEngine | None = None,
    *,
    constant: Sequence[str] = (),
) -> np.ndarray | None:
    """Row indices sorting ``table`` by ``groups`` (small non-negative integers: one write's
    partition and bucket), then by key, when that alone is what :func:`dedupe_within_write`
    of each group would return; else None (call it per group).

    That holds when no key repeats within a group and every row is an addition (``+I``/``+U``)
    and ``engine`` keeps a lone addition as it is (deduplicate, first-row): one sort of the
    whole write instead of a split and a sort per group. ``constant`` as for
    :func:`dedupe_within_write`.
    """
    if not _one_sort_applies(table, engine or Deduplicate()):
        return None
    columns = kernel_keys(table, _sort_key(key, constant))
    found = native.sorted_groups(columns, groups)
    return None if found is None else found[0]


def _one_sort_applies(table: pa.Table, engine: MergeEngine) -> bool:
    """Whether one sort by key stands for :func:`dedupe_within_write` of ``table`` (should no
    key repeat): every row an addition, and an engine that keeps a lone addition as it is."""
    if not isinstance(engine, (Deduplicate, FirstRow)) or table.num_rows == 0:
        return False
    kinds = row_kinds(table)
    return not bool(((kinds != RowKind.INSERT) & (kinds != RowKind.UPDATE_AFTER)).any())


#: A write cut into sorted groups: ``(order, starts, codes)``, row indices sorted by group
#: then key, where each group starts in ``order`` and its code.
SortedGroups = tuple[np.ndarray, np.ndarray, np.ndarray]


def cut_groups(table: pa.Table, key: Sequence[str], buckets: int,
               partition_codes: np.ndarray | None, engine: MergeEngine | None = None, *,
               constant: Sequence[str] = ()) -> tuple[pa.Array, SortedGroups | None]:
    """One write cut into its groups (one per partition and bucket): the bucket of every row
    (:func:`~arrowlake.merge.bucketing.bucket_of` of ``key``), and, where one sort by group
    and key stands for deduplicating each group (:func:`unique_run_order`'s rule), the rows
    sorted so: ``(order, starts, codes)`` with each group's code ``bucket + buckets *
    partition code`` (``partition_codes``: each row's partition as a small integer, None
    without partitions). Otherwise None (the caller deduplicates each group).

    The hash and the sort are one native call without the GIL."""
    if not _one_sort_applies(table, engine or Deduplicate()):
        return bucket_of(table, key, buckets), None
    hashed = [table.column(name) for name in key]
    for column in hashed:
        check_hashable(column)
    return native.cut_groups(hashed, kernel_keys(table, _sort_key(key, constant)), buckets,
                             partition_codes)


def _sort_key(key: Sequence[str], constant: Sequence[str]) -> list[str]:
    return [k for k in key if k not in constant] or list(key)


# -- shared pieces -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Segments:
    """Per key, the versions after the last reset (``include``, by position) and whether the
    newest version is itself a reset (``deleted``)."""

    include: np.ndarray
    deleted: np.ndarray
    restarted: np.ndarray | None = None
    """Per key: a reset or restart happened, so versions older than the merged ones must stay
    hidden (the merged row is written as a restart when older runs remain)."""

    @classmethod
    def everything(cls, versions: KeyVersions) -> _Segments:
        return cls(np.ones(versions.num_rows, bool), np.zeros(versions.num_keys, bool))

    @classmethod
    def after_last(
        cls, versions: KeyVersions, reset: np.ndarray, restart: np.ndarray | None = None
    ) -> _Segments:
        """Segments after the last ``reset`` (a retraction, excluded) or from the last
        ``restart`` (an addition that replaces older versions, included)."""
        last_reset = versions.last_where(reset)
        begin = np.maximum(last_reset + 1, versions.starts)
        restarted = last_reset >= 0
        if restart is not None and restart.any():
            last_restart = versions.last_where(restart)
            begin = np.maximum(begin, last_restart)
            restarted |= last_restart >= 0
        include = np.arange(versions.num_rows) >= versions.per_position(begin)
        deleted = last_reset == versions.ends - 1
        return cls(include, deleted, restarted & ~deleted)


def _flag(options: Mapping[str, str | bool], name: str) -> bool:
    value = options.get(name, False)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValidationError(f"Option '{name}' must be 'true' or 'false', not {value!r}")
    return text == "true"


def _drop_retractions(table: pa.Table, kinds: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    retractions = is_retraction(kinds)
    if not retractions.any():
        return table, kinds
    return take_rows(table, np.flatnonzero(~retractions)), kinds[~retractions]


def _finish(
    table: pa.Table,
    kinds: np.ndarray,
    rows: np.ndarray,
    keep_retractions: bool,
    identity_possible: bool,
) -> pa.Table:
    """Take the winning ``rows`` (in key order) and apply what a retraction winner means."""
    # Runs of additions only (the common case) have no retraction or restart to look at.
    special = len(kinds) > 0 and bool(
        kinds.max() > RowKind.UPDATE_AFTER or (kinds == RowKind.UPDATE_BEFORE).any())
    retracted = is_retraction(kinds[rows]) if special else None
    if retracted is not None and not keep_retractions and retracted.any():
        rows = rows[~retracted]
        retracted = retracted[~retracted]
    if identity_possible and len(rows) == table.num_rows and _is_identity(rows):
        result = table
    else:
        result = take_rows(table, pa.array(rows, pa.int64()))
    if retracted is not None and ROW_KIND in result.column_names:
        restarts = _restarts(kinds[rows])
        if not keep_retractions and restarts.any():
            # With every older version merged in, a restart is an ordinary update.
            result = _set_row_kind(result, np.where(restarts, RowKind.UPDATE_AFTER, kinds[rows]))
        elif retracted.any():
            result = _set_row_kind(result, np.where(retracted, RowKind.DELETE, kinds[rows]))
    return result


def _restarts(kinds: np.ndarray) -> np.ndarray:
    return np.asarray(kinds == RowKind.RESTART)


def _is_identity(rows: np.ndarray) -> bool:
    return bool(np.array_equal(rows, np.arange(len(rows))))


def _assemble(
    table: pa.Table,
    kinds: np.ndarray,
    versions: KeyVersions,
    columns: dict[str, tuple[pa.ChunkedArray, np.ndarray] | pa.Array | pa.ChunkedArray],
    segment: _Segments,
    keep_retractions: bool,
) -> pa.Table:
    """Build the merged table from per-key positions (taken) or per-key merged arrays."""
    deleted = segment.deleted
    keep = np.ones(versions.num_keys, bool) if keep_retractions else ~deleted
    keep_all = bool(keep.all())
    arrays = []
    for name in table.column_names:
        entry = columns[name]
        if isinstance(entry, tuple):
            column, positions = entry
            if not keep_all:
                positions = positions[keep]
            arrays.append(take(column, versions.rows_at(positions)))
        else:
            arrays.append(entry if keep_all else take(entry, np.flatnonzero(keep)))
    result = pa.Table.from_arrays(arrays, schema=table.schema)
    if ROW_KIND in result.column_names:
        newest = kinds[versions.last_rows()]
        # The merged row of a key that is still there is an addition even if its newest
        # version was a retraction that only subtracted (aggregation).
        addition = np.where(
            is_retraction(newest) | _restarts(newest), RowKind.UPDATE_AFTER, newest
        )
        if keep_retractions and segment.restarted is not None:
            # Merged without the oldest versions: the row must still hide them.
            addition = np.where(segment.restarted, RowKind.RESTART, addition)
        merged_kind = np.where(deleted, RowKind.DELETE, addition)
        result = _set_row_kind(result, merged_kind[keep])
    return result


def _set_row_kind(table: pa.Table, kinds: np.ndarray) -> pa.Table:
    index = table.column_names.index(ROW_KIND)
    field_ = table.schema.field(index)
    return table.set_column(index, field_, pa.array(kinds.astype(np.int8), field_.type))


def _keep_tombstones(
    column: pa.ChunkedArray,
    merged: pa.Array | pa.ChunkedArray,
    versions: KeyVersions,
    deleted: np.ndarray,
) -> pa.Array | pa.ChunkedArray:
    """Merged values, except that deleted keys keep their tombstone's own value."""
    if isinstance(merged, pa.ChunkedArray):
        merged = merged.combine_chunks()
    tombstones = take(column, pa.array(versions.last_rows()[deleted], pa.int64()))
    if isinstance(tombstones, pa.ChunkedArray):
        tombstones = tombstones.combine_chunks()
    # Concatenate and take: works for every type, where if_else lacks kernels for some.
    both = pa.concat_arrays([merged, tombstones])
    picks = np.arange(len(merged), dtype=np.int64)
    picks[deleted] = len(merged) + np.arange(len(tombstones))
    return take(both, picks)


__all__ = [
    "RETRACTABLE",
    "Aggregation",
    "Deduplicate",
    "FirstRow",
    "MergeEngine",
    "PartialUpdate",
    "dedupe_within_write",
    "engine_from_options",
]
