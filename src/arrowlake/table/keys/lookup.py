"""Where the current version of each key lives: (data file, row position), for merge-on-write.

In a table with deletion vectors every key has at most one live row: a row of some data file
of its partition and bucket whose position no vector deletes. A write finds those rows for the
keys it writes, reading only the key columns of the bucket's files whose key range may hold one
of them, and, when the engine needs the current values (partial-update, aggregation, a sequence
field, the ``lookup`` changelog), only the row groups that hold the matches.

Matching is vectorized: ``index_in`` of the file's keys in the written keys for a one-column
key, a hash join for composite keys; deleted positions are dropped with a sorted-array test.

Keys stay Arrow values or integers on this path: a key range is compared in the stored form of
key bounds (integers for temporal types, :func:`arrowlake.io.stats.encode_scalar`), never as
Python datetimes, which cannot hold every value Arrow can (years past 9999 in the column's
zone, nanoseconds outside pandas' range). Filters (which take Python literals) are built from
keys only where every value has an exact Python form (:func:`literal_keys`); otherwise the
caller narrows with a wider filter and matches exactly in Arrow.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake import native
from arrowlake.expressions import AlwaysTrue, Expr, and_all, col
from arrowlake.io.lru import SizedLRU
from arrowlake.io.stats import encode_scalar
from arrowlake.io.storage import Storage
from arrowlake.io.writer import DataFileWriter
from arrowlake.merge.versions import sortable_key
from arrowlake.scan.read import file_fragment
from arrowlake.scan.split import FileTask
from arrowlake.schema import field_id
from arrowlake.table.keys import index as key_index
from arrowlake.table.keys.index import KeyIndex
from arrowlake.table.keys.run_cache import RUNS

_POSITION = "_al_position"
_INCOMING = "_al_incoming"


@dataclass
class Matches:
    """The live rows of written keys: for each, the file, the position in it and the index of
    the key in the written keys, grouped by file (a file's matches are adjacent); ``rows``
    holds their current values when asked for."""

    file_ids: np.ndarray
    positions: np.ndarray
    incoming: np.ndarray
    rows: pa.Table | None = None
    #: When found through a bucket's key index: the index, and each match's slot in it.
    index: KeyIndex | None = None
    slots: np.ndarray | None = None
    #: The slots of the matches the write marks deleted (what advances the index).
    deleted_slots: list[np.ndarray] = field(default_factory=list)
    #: The rows of the matches the write marks deleted, when ``rows`` holds them (its
    #: changelog's before-images).
    deleted_rows: list[pa.Table] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.positions)


def locate(storage: Storage, files: Sequence[FileTask], file_schemas: dict[int, pa.Schema],
           schema: pa.Schema, key: Sequence[str], keys: pa.Table,
           columns: Sequence[str] | None = None, group: Hashable | None = None) -> Matches:
    """The live rows of ``keys`` (a table of the key columns, one row per key) in ``files``
    (one bucket's live files, with their vectors). With ``columns``, their values are read too
    (in ``schema``, the table's current schema). ``group`` names the bucket (all of whose
    live files ``files`` must be) to look it up in its key index
    (:mod:`arrowlake.table.keys.index`)."""
    return locate_many(storage, file_schemas, schema, key,
                       [Lookup(files, keys, columns, group)])[0]


@dataclass(frozen=True)
class Lookup:
    """One bucket's part of :func:`locate_many`: :func:`locate`'s arguments that differ
    between buckets."""

    files: Sequence[FileTask]
    keys: pa.Table
    columns: Sequence[str] | None = None
    group: Hashable | None = None


def locate_many(storage: Storage, file_schemas: dict[int, pa.Schema], schema: pa.Schema,
                key: Sequence[str], lookups: Sequence[Lookup]) -> list[Matches]:
    """:func:`locate` of many buckets. The buckets with a key index are searched in one
    call (:func:`~arrowlake.table.keys.index.search_many`: in parallel, without the GIL);
    the others file by file."""
    out: list[Matches | None] = [None] * len(lookups)
    images = [sortable_key(one.keys, key) for one in lookups]
    wanted = [i for i, (one, image) in enumerate(zip(lookups, images, strict=True))
              if one.group is not None and image is not None and one.files]
    indexes = dict(zip(wanted, _indexes(storage, [(lookups[i].files, lookups[i].group)
                                                  for i in wanted],
                                        file_schemas, schema, key), strict=True))
    indexed: list[tuple[int, KeyIndex, np.ndarray]] = []
    for i, (one, keys_image) in enumerate(zip(lookups, images, strict=True)):
        index = indexes.get(i)
        if index is not None and keys_image is not None and index.dtype == keys_image.dtype:
            indexed.append((i, index, keys_image))
            continue
        out[i] = _locate_in_files(storage, one.files, file_schemas, schema, key, one.keys,
                                  keys_image, one.columns)
    found = key_index.search_many([(index, image) for _, index, image in indexed])
    for (i, index, _), (slots, incoming) in zip(indexed, found, strict=True):
        one = lookups[i]
        out[i] = _locate_indexed(storage, index, one.files, file_schemas, schema, slots,
                                 incoming, one.columns)
    return [m for m in out if m is not None]


def _locate_in_files(storage: Storage, files: Sequence[FileTask],
                     file_schemas: dict[int, pa.Schema], schema: pa.Schema, key: Sequence[str],
                     keys: pa.Table, keys_image: np.ndarray | None,
                     columns: Sequence[str] | None) -> Matches:
    """:func:`locate` without an index: each live file whose key range overlaps the keys'
    is searched."""
    bounds = _key_bounds(keys, key)
    parts: list[tuple[FileTask, np.ndarray, np.ndarray]] = []
    for task in files:
        if bounds is not None and task.key_range is not None and not _overlaps(
                bounds, task.key_range):
            continue
        positions, incoming = _match_file(storage, task, file_schemas[task.schema_id], schema,
                                          key, keys, keys_image)
        if len(positions):
            parts.append((task, positions, incoming))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        rows = None if columns is None else schema.empty_table().select(list(columns))
        return Matches(empty, empty, empty, rows)
    file_ids = np.concatenate([np.full(len(p), t.file_id, dtype=np.int64) for t, p, _ in parts])
    positions = np.concatenate([p for _, p, _ in parts])
    incoming = np.concatenate([i for _, _, i in parts])
    rows = None
    if columns is not None:
        rows = pa.concat_tables([
            rows_at(storage, task, file_schemas[task.schema_id], schema, list(columns), pos)
            for task, pos, _ in parts])
    return Matches(file_ids, positions, incoming, rows)


def lookup_columns(primary_key: Sequence[str], partition_by: Sequence[str]) -> list[str]:
    """The key columns a lookup matches: partition columns are constant within a bucket's
    group of files, so they are left out (unless they are the whole key)."""
    return [k for k in primary_key if k not in partition_by] or list(primary_key)


def index_group(group: Hashable, schema: pa.Schema, key: Sequence[str]) -> Hashable:
    """The key index cache's name of bucket ``group`` looked up by ``key`` in ``schema``."""
    return (group, *_cache_key("", 0, schema, key)[2:])


def state_of(files: Sequence[FileTask]) -> key_index.State:
    """The state of a bucket with live files ``files`` (see :mod:`arrowlake.table.keys.index`)."""
    return frozenset((t.path, t.deletes.cardinality if t.deletes is not None else 0)
                     for t in files)


def _indexes(storage: Storage, buckets: Sequence[tuple[Sequence[FileTask], Hashable]],
             file_schemas: dict[int, pa.Schema], schema: pa.Schema, key: Sequence[str]
             ) -> list[KeyIndex | None]:
    """Each bucket's key index (``(files, group)``: the bucket's live files and its name) in
    the state its files give: cached, or built from the files' key columns, every missing
    one in one call (:func:`~arrowlake.table.keys.index.build_many`); None for keys without
    a sortable image."""
    out: list[KeyIndex | None] = [None] * len(buckets)
    missing: list[tuple[int, Hashable, key_index.Parts, key_index.State]] = []
    for i, (files, group) in enumerate(buckets):
        name = index_group(group, schema, key)
        state = state_of(files)
        index = key_index.cached(name, state)
        if index is not None:
            out[i] = index
            continue
        parts = []
        for task in files:
            stored = _stored_keys(storage, task, file_schemas[task.schema_id], schema, key)
            if stored.sorted_image is None:
                break
            deleted = None
            if task.deletes is not None and task.deletes.cardinality:
                deleted = task.deletes.positions(storage, task.path)
            parts.append((task.path, stored.sorted_image, deleted))
        else:
            missing.append((i, name, parts, state))
    built = key_index.build_many([(parts, state) for _, _, parts, state in missing])
    for (i, name, _, _), index in zip(missing, built, strict=True):
        key_index.keep(name, index)
        out[i] = index
    return out


def _locate_indexed(storage: Storage, index: KeyIndex, files: Sequence[FileTask],
                    file_schemas: dict[int, pa.Schema], schema: pa.Schema, slots: np.ndarray,
                    incoming: np.ndarray, columns: Sequence[str] | None) -> Matches:
    """The matches of a search of ``index`` (``slots`` and ``incoming`` as
    :meth:`KeyIndex.search` gives them)."""
    which, positions = index.where(slots)
    # Grouped by file, so that each file's rows are read (and marked deleted) in one go; file
    # numbers as 16 bits take numpy's radix sort, 4x faster than a stable sort of int64.
    order = np.argsort(which.astype(np.uint16) if len(index.files) <= 1 << 16 else which,
                       kind="stable")
    slots, incoming, which, positions = slots[order], incoming[order], which[order], \
        positions[order]
    by_path = {t.path: t for t in files}
    # Files the index names but the bucket no longer has hold no live key of it.
    ids = np.array([by_path[p].file_id if p in by_path else -1 for p in index.files],
                   dtype=np.int64)
    tasks = [by_path.get(p) for p in index.files]
    rows = None
    if columns is not None:
        parts = []
        starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]]).tolist() \
            if len(which) else []
        for start, end in zip(starts, [*starts[1:], len(which)], strict=False):
            task = tasks[int(which[start])]
            assert task is not None
            parts.append(rows_at(storage, task, file_schemas[task.schema_id], schema,
                                 list(columns), positions[start:end]))
        rows = pa.concat_tables(parts) if parts else schema.empty_table().select(list(columns))
    return Matches(ids[which], positions, incoming, rows, index, slots)


def _key_bounds(keys: pa.Table, key: Sequence[str]) -> tuple[Any, Any] | None:
    """The written keys' first-column range in the stored form of key bounds (what
    ``FileTask.key_range`` holds), to skip files whose key range lies outside it."""
    bounds = pc.min_max(keys.column(key[0]))
    low, high = encode_scalar(bounds["min"]), encode_scalar(bounds["max"])
    return None if low is None or high is None else (low, high)


def _overlaps(bounds: tuple[Any, Any], file_range: tuple[tuple, tuple]) -> bool:
    low, high = bounds
    try:
        return not (file_range[1][0] < low or file_range[0][0] > high)
    except TypeError:
        return True


_DAY_US = 86_400 * 10**6
#: The microseconds since the epoch that Python's datetime holds in any zone: its years 1 to
#: 9999, a day in from each end (no zone is a day or more away from UTC).
_PYTHON_US = (-62_135_596_800 * 10**6 + _DAY_US, 253_402_300_800 * 10**6 - 1 - _DAY_US)
#: The same for nanoseconds as pandas holds them (the int64 range; its minimum is NaT).
_PANDAS_NS = (np.iinfo(np.int64).min + 1 + _DAY_US * 1000, np.iinfo(np.int64).max - _DAY_US * 1000)
_PYTHON_DAYS = (-719_162, 2_932_896)  # date(1, 1, 1) and date(9999, 12, 31)
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _python_range(typ: pa.DataType) -> tuple[int, int] | None:
    """The integer values of temporal ``typ`` that become exact Python values (None: every
    value does, or the type is not temporal)."""
    t = pa.types
    if t.is_timestamp(typ):
        if typ.unit == "ns":
            return _PANDAS_NS
        per_us = _PER_SECOND["us"] // _PER_SECOND[typ.unit]
        return -(-_PYTHON_US[0] // per_us), _PYTHON_US[1] // per_us
    if t.is_date32(typ):
        return _PYTHON_DAYS
    if t.is_date64(typ):
        return _PYTHON_DAYS[0] * 86_400_000, _PYTHON_DAYS[1] * 86_400_000
    if t.is_time(typ):
        return 0, 86_400 * _PER_SECOND[typ.unit] - 1
    return None


def literal_keys(values: pa.Array | pa.ChunkedArray) -> list[Any] | None:
    """``values`` (of one key column) as the Python values a filter literal takes, or None when
    some value has no exact Python form: a timestamp past year 9999 (or before year 1) in its
    zone, a nanosecond one outside pandas' range, a date outside years 1-9999, a time outside
    a day or with nanoseconds. The check is on the integer values, in Arrow."""
    typ = values.type
    bounds = _python_range(typ)
    if bounds is not None and len(values) - values.null_count:
        ints = values.cast(pa.int32() if typ.bit_width == 32 else pa.int64())
        low_high = pc.min_max(ints)
        if low_high["min"].as_py() < bounds[0] or low_high["max"].as_py() > bounds[1]:
            return None
        if pa.types.is_time64(typ) and typ.unit == "ns":
            nanos = np.asarray(pc.fill_null(ints, 0).to_numpy(zero_copy_only=False))
            if bool(np.any(nanos % 1000)):
                return None  # a time of day literal holds microseconds
    try:
        return values.to_pylist()
    except (OverflowError, ValueError, TypeError, pa.ArrowException):
        return None  # e.g. nanoseconds without pandas


def key_range_filter(name: str, values: pa.Array | pa.ChunkedArray) -> Expr:
    """A filter on column ``name`` that every row holding one of ``values`` passes: their range,
    each bound left out when it has no exact Python form (so possibly no filter at all)."""
    if len(values) == values.null_count:
        return AlwaysTrue()
    bounds = pc.min_max(values)
    low, high = literal_keys(pa.array([bounds["min"]])), literal_keys(pa.array([bounds["max"]]))
    parts: list[Expr] = []
    if low is not None:
        parts.append(col(name) >= low[0])
    if high is not None:
        parts.append(col(name) <= high[0])
    return and_all(parts) if parts else AlwaysTrue()


def _physical(file_schema: pa.Schema, schema: pa.Schema, name: str) -> str | None:
    """The name column ``name`` of the table has in a file (found by field id)."""
    wanted = field_id(schema.field(name))
    for f in file_schema:
        if field_id(f) == wanted:
            return f.name
    return None


def _read_columns(storage: Storage, task: FileTask, file_schema: pa.Schema, schema: pa.Schema,
                  names: Sequence[str], row_groups: Sequence[int] | None = None) -> pa.Table:
    """Columns ``names`` of the table from one file (renamed, widened or missing columns
    handled by field id), of the given row groups only when given."""
    fragment = file_fragment(storage, task)
    physical = {n: _physical(file_schema, schema, n) for n in names}
    present = [p for p in physical.values() if p is not None]
    if row_groups is not None:
        fragment = fragment.subset(row_group_ids=list(row_groups))
    raw = fragment.to_table(columns=present, schema=file_schema, use_threads=False)
    out = []
    for n in names:
        typ = schema.field(n).type
        p = physical[n]
        column = raw.column(p) if p is not None else pa.nulls(raw.num_rows, typ)
        out.append(column.cast(typ) if column.type != typ else column)
    return pa.table(out, schema=pa.schema([schema.field(n) for n in names]))


def match_keys(left: pa.Table, right: pa.Table, key: Sequence[str]
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(rows of left, rows of right)`` holding equal keys (keys are unique in ``right``)."""
    if len(key) == 1:
        found = pc.index_in(left.column(key[0]), value_set=right.column(key[0]).combine_chunks())
        if found.null_count:
            at_left = np.flatnonzero(found.is_valid().to_numpy(zero_copy_only=False))
        else:
            at_left = np.arange(len(found))
        at_right = pc.drop_null(found).to_numpy(zero_copy_only=False)
        return at_left.astype(np.int64), at_right.astype(np.int64)
    ours = left.select(list(key)).append_column(
        _POSITION, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    theirs = right.select(list(key)).append_column(
        _INCOMING, pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = ours.join(theirs, list(key), join_type="inner", use_threads=False)
    return (joined.column(_POSITION).to_numpy().astype(np.int64),
            joined.column(_INCOMING).to_numpy().astype(np.int64))


@dataclass(frozen=True)
class _StoredKeys:
    """A file's key columns, and, when the file is sorted by key (every file arrowlake writes
    into a bucket is), their order-preserving numpy image: written keys are then found by
    binary search, not by hashing every stored key."""

    table: pa.Table
    sorted_image: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + (self.sorted_image.nbytes
                                    if self.sorted_image is not None else 0)


#: Bytes of key columns a process keeps for lookups, by file (least recently used dropped
#: past it). Data files never change (unique names), so a cached column stays right; a writer
#: then reads only the files added since its last lookup.
KEY_CACHE_BYTES = 256 * 1024 * 1024
_KEYS: SizedLRU[_StoredKeys] = SizedLRU(KEY_CACHE_BYTES, lambda stored: stored.nbytes)


def _cache_key(path: str, file_size: int, schema: pa.Schema, key: Sequence[str]
               ) -> tuple[str, int, tuple[str, ...], str]:
    # Keyed by the types too: a widened key column is read again in its new type.
    types = ",".join(str(schema.field(k).type) for k in key)
    return (path, file_size, tuple(key), types)


def _keys_of(table: pa.Table, key: Sequence[str]) -> _StoredKeys:
    image = sortable_key(table, key)
    if image is not None and len(image) > 1 and not bool(np.all(image[1:] > image[:-1])):
        image = None  # not sorted with unique keys: matched by hashing instead
    return _StoredKeys(table, image)


def _stored_keys(storage: Storage, task: FileTask, file_schema: pa.Schema, schema: pa.Schema,
                 key: Sequence[str]) -> _StoredKeys:
    cache_key = _cache_key(task.path, task.file_size, schema, key)
    stored = _KEYS.get(cache_key)
    if stored is None:
        stored = _keys_of(_read_columns(storage, task, file_schema, schema, key), key)
        _KEYS.put(cache_key, stored)
    return stored


Written = dict[tuple[str | None, int], list[tuple[str, np.ndarray | None]]]


def remember_written(storage: Storage, location: str,
                     started: Sequence[tuple[DataFileWriter, pa.Table]], schema: pa.Schema,
                     key: Sequence[str]) -> Written:
    """Keep the key columns of the files finished writers wrote (each writer with the rows it
    was given, in ``schema``, the table's current schema), so that the next lookup in their
    buckets finds them without reading the files back. Per (partition, bucket), each file's
    path and sorted key image (None for keys without one)."""
    written: Written = {}
    for writer, rows in started:
        offset = 0
        for f in writer.files:
            path = storage.join(location, f.path)
            stored = _keys_of(rows.slice(offset, f.row_count).select(list(key)).combine_chunks(),
                              key)
            _KEYS.put(_cache_key(path, f.file_size, schema, key), stored)
            offset += f.row_count
            written.setdefault((writer.partition_values, writer.bucket or 0), []).append(
                (path, stored.sorted_image))
    return written


def _search_sorted(stored: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(positions in stored, indices into keys)`` of the keys found in ``stored`` (sorted,
    unique): one binary search per written key, in the native core."""
    found, at = native.index_find(stored, keys)
    incoming = np.flatnonzero(found).astype(np.int64)
    return at[incoming].astype(np.int64, copy=False), incoming


def _match_file(storage: Storage, task: FileTask, file_schema: pa.Schema, schema: pa.Schema,
                key: Sequence[str], keys: pa.Table,
                keys_image: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(positions in the file, indices into keys)`` of the file's live rows of ``keys``
    (``keys_image``: their :func:`sortable_key` image, when they have one)."""
    stored = _stored_keys(storage, task, file_schema, schema, key)
    if stored.sorted_image is not None and keys_image is not None \
            and stored.sorted_image.dtype == keys_image.dtype:
        positions, incoming = _search_sorted(stored.sorted_image, keys_image)
    else:
        positions, incoming = match_keys(stored.table, keys, key)
    if task.deletes is not None and task.deletes.cardinality and len(positions):
        # The deleted positions are sorted (uint64): a binary search per match.
        deleted = task.deletes.positions(storage, task.path)
        live = ~native.index_find(deleted, positions.astype(np.uint64))[0]
        positions, incoming = positions[live], incoming[live]
    return positions, incoming


def rows_at(storage: Storage, task: FileTask, file_schema: pa.Schema, schema: pa.Schema,
             names: list[str], positions: np.ndarray) -> pa.Table:
    """The rows at ``positions`` of one file, reading only the row groups that hold them; taken
    from the file's decoded rows instead when the run cache holds them (the files a
    ``lookup`` table's writer wrote, :mod:`~arrowlake.table.keys.run_cache`) and its schema
    holds each of ``names`` as ``schema`` does: same field id and type (a column dropped and
    added again under its name is another column, which the file does not hold)."""
    held = RUNS.get((task.path, task.schema_id))
    if held is not None and all(_same_column(file_schema, schema, n) for n in names):
        return held.rows.select(names).take(pa.array(positions))
    metadata = file_fragment(storage, task).metadata
    counts = np.array([metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)],
                      dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)))
    groups = np.searchsorted(starts, positions, side="right") - 1
    wanted = np.unique(groups)
    read = _read_columns(storage, task, file_schema, schema, names, wanted.tolist())
    # Positions within the row groups read, concatenated in order.
    offsets = np.concatenate(([0], np.cumsum(counts[wanted])))
    index = offsets[np.searchsorted(wanted, groups)] + (positions - starts[groups])
    return read.take(pa.array(index))


def _same_column(file_schema: pa.Schema, schema: pa.Schema, name: str) -> bool:
    if name not in file_schema.names:
        return False
    ours, theirs = file_schema.field(name), schema.field(name)
    return field_id(ours) == field_id(theirs) and ours.type == theirs.type


__all__ = [
    "Matches",
    "index_group",
    "key_range_filter",
    "literal_keys",
    "locate",
    "lookup_columns",
    "match_keys",
    "remember_written",
    "rows_at",
    "state_of",
]


os.register_at_fork(after_in_child=lambda: _KEYS.after_fork(keep=False))
