"""Reading splits: Parquet files in, Arrow batches in the table's current schema out.

Files are grouped by the schema version they were written in; each group is one pyarrow
dataset read with threads, pushed-down projection and filter (row groups are skipped by their
statistics). Columns are matched by field id, so renamed columns are found under their old
names, widened ones are cast, and columns added later read as nulls.

Splits of primary-key tables hold whole buckets: each bucket's runs are read here and merged by
:mod:`arrowlake.merge.read`, unless they need no merging (see :func:`needs_merge`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, pairwise
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from arrowlake.errors import ArrowlakeError, ValidationError
from arrowlake.expressions import (
    AlwaysTrue,
    Expr,
    and_all,
    conjuncts,
    referenced_columns,
    rename_columns,
    to_arrow,
)
from arrowlake.expressions.binding import value_type
from arrowlake.expressions.tree import And, Comparison, Literal, Or
from arrowlake.io.lru import SizedLRU
from arrowlake.io.prefetch import FileRef, prefetched_windows
from arrowlake.io.stats import decode_values
from arrowlake.io.storage import Storage
from arrowlake.merge.read import (
    Bucket,
    MergeSpec,
    as_runs,
    merge_buckets,
    merge_rows,
    split_filter,
    split_residual,
)
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD
from arrowlake.scan.deleted_rows import (
    GROUP_BYTES,
    live_batches,
    read_ahead,
    read_live,
    select_live,
)
from arrowlake.scan.read_errors import checked as _checked
from arrowlake.schema import field_id

if TYPE_CHECKING:
    from arrowlake.scan.split import FileTask, Split

_R = TypeVar("_R")
_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True)
)


@dataclass
class _GroupRead:
    """How to read one group of files written in the same schema version."""

    storage: Storage
    files: list[FileTask]
    file_schema: pa.Schema
    read_columns: list[str]  # the files' columns that are read (projection and filter)
    columns: list[str] | dict[str, pc.Expression]
    filter: pc.Expression | None  # pushed down into the dataset scan
    residual: pc.Expression | None  # applied after reading (filter needs columns not in files)
    constants: list[str] = field(default_factory=list)  # partition columns filled per file
    # Files with deleted rows, read by ``_masked`` instead (see scan/deleted_rows.py).
    masked: list[FileTask] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.masked:
            self.files, self.masked = _with_deletes(self.files)

    def datasets(self) -> Iterator[ds.FileSystemDataset]:
        """The files as datasets to scan: one, or on high-latency storage one per window of
        files, each fetched concurrently (only the chunks read) while the previous is decoded.
        Files with deleted rows are not among them (``_masked`` reads those)."""
        storage = self.storage
        if not self.files:
            return
        if not storage.high_latency:
            fs = storage.filesystem()
            fragments = [_fragment(storage, fs, f) for f in self.files]
            yield ds.FileSystemDataset(fragments, self.file_schema, _FORMAT, fs)
            return
        refs = [FileRef(f.path, f.file_size) for f in self.files]
        for window in prefetched_windows(storage, refs, _FORMAT, columns=self.read_columns,
                                         filter=self.filter, schema=self.file_schema):
            yield ds.FileSystemDataset(window.fragments, self.file_schema, _FORMAT,
                                       window.filesystem)


#: A read of files smaller than this in all runs on the calling thread.
_THREADS_BYTES = 4 * 1024 * 1024

#: Fragments by (path, size), at most 4096 (each counts as one). A forked child starts
#: without them: their filesystems belong to the parent.
_FRAGMENTS: SizedLRU[ds.ParquetFileFragment] = SizedLRU(4096, lambda _: 1)
os.register_at_fork(after_in_child=lambda: _FRAGMENTS.after_fork(keep=False))


def _fragment(storage: Storage, fs: pafs.FileSystem, task: FileTask) -> ds.ParquetFileFragment:
    """The file's fragment, reused across scans: a fragment keeps the footer it parsed, and
    data files are immutable (unique names, never rewritten), so a cached one stays valid.
    Saves opening and parsing every footer again on repeated reads of small runs."""
    path = storage.fs_path(task.path)
    key = (path, task.file_size)
    fragment = _FRAGMENTS.get(key)
    if fragment is None:
        fragment = _FORMAT.make_fragment(path, fs, file_size=task.file_size)
        _FRAGMENTS.put(key, fragment)
    return fragment


def file_fragment(storage: Storage, task: FileTask) -> ds.ParquetFileFragment:
    """The data file of ``task`` as a (cached) Parquet fragment, for readers of single files."""
    return _fragment(storage, storage.filesystem(), task)


def _group_by_schema(files: Sequence[FileTask]) -> list[tuple[int, list[FileTask]]]:
    groups: dict[int, list[FileTask]] = {}
    for f in files:
        groups.setdefault(f.schema_id, []).append(f)
    return list(groups.items())


def _constant_columns(split: Split, files: Sequence[FileTask], needed: Sequence[str]
                      ) -> list[str]:
    """Partition columns that can be filled from the files' partition values instead of read:
    the filter (pushed into the scan) does not use them and every file has a stored value."""
    if not split.partition_by:
        return []
    used = set() if isinstance(split.filter, AlwaysTrue) else referenced_columns(split.filter)
    wanted = [c for c in needed if c in split.partition_by and c not in used]
    return fillable(split.partition_by, files, wanted)


def fillable(partition_by: Sequence[str], files: Sequence[FileTask],
             columns: Sequence[str]) -> list[str]:
    """The ``columns`` whose stored partition value is known in every file. A stored null is
    not trusted: besides a null it stands for values statistics cannot hold (strings over
    256 characters, NaN), so such columns are read from the files."""
    import json

    if not columns or any(f.partition_values is None for f in files):
        return []
    positions = {c: partition_by.index(c) for c in columns}
    known = set(columns)
    for text in {f.partition_values for f in files}:
        values = json.loads(text or "[]")
        known -= {c for c, i in positions.items() if i >= len(values) or values[i] is None}
    return [c for c in columns if c in known]


# A string or binary column filled from one value is built in chunks whose offsets fit int32.
_MAX_CHUNK_BYTES = (1 << 31) - 1


def constant_column(value: pa.Scalar, length: int) -> pa.ChunkedArray:
    """``length`` copies of ``value`` as a column of any length (chunked where one array's
    32-bit offsets could not address the data)."""
    size = len(value.as_buffer()) if hasattr(value, "as_buffer") and value.is_valid else 0
    step = max(1, _MAX_CHUNK_BYTES // size) if size else length or 1
    if length <= step:
        return pa.chunked_array([constant_array(value, length)], value.type)
    return pa.chunked_array([constant_array(value, min(step, length - start))
                             for start in range(0, length, step)], value.type)


def constant_array(value: pa.Scalar, length: int) -> pa.Array:
    """``length`` copies of ``value``, built from buffers (Arrow's own repeat and take are an
    order of magnitude slower for strings). String and binary values are limited to 2 GiB in
    all; :func:`constant_column` has no limit."""
    import numpy as np

    typ = value.type
    if not value.is_valid:
        return pa.nulls(length, typ)
    if pa.types.is_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_string(typ) \
            or pa.types.is_large_binary(typ):
        data = value.as_buffer().to_pybytes() if hasattr(value, "as_buffer") else b""
        wide = pa.types.is_large_string(typ) or pa.types.is_large_binary(typ)
        if not wide and len(data) * length > _MAX_CHUNK_BYTES:
            raise ValueError(f"{length} copies of a {len(data)}-byte value exceed the 2 GiB a "
                             f"{typ} array can hold; use constant_column")
        offsets = np.arange(length + 1, dtype=np.int64 if wide else np.int32) * len(data)
        return pa.Array.from_buffers(typ, length, [None, pa.py_buffer(offsets),
                                                   pa.py_buffer(data * length)])
    width = getattr(typ, "bit_width", 0)
    if width in (8, 16, 32, 64) and not pa.types.is_decimal(typ):
        one = np.frombuffer(pa.array([value], typ).buffers()[1], dtype=np.uint8,
                            count=width // 8)
        return pa.Array.from_buffers(typ, length, [None, pa.py_buffer(np.tile(one, length))])
    return pa.array([value], typ).take(pa.array(np.zeros(length, np.int32)))


def partition_scalars(split: Split, task: FileTask, columns: Sequence[str],
                       cache: dict[tuple[str | None, str], pa.Scalar]) -> list[pa.Scalar]:
    import json

    out = []
    for name in columns:
        key = (task.partition_values, name)
        if key not in cache:
            values = json.loads(task.partition_values or "[]")
            stored = values[split.partition_by.index(name)]
            cache[key] = decode_values([stored], split.schema.field(name).type)[0]
        out.append(cache[key])
    return out


def _plan_group(split: Split, schema_id: int, files: list[FileTask],
                needed: Sequence[str]) -> _GroupRead:
    constants = _constant_columns(split, files, needed)
    group = _plan_read(split, schema_id, files, [c for c in needed if c not in constants])
    group.constants = constants
    return group


def _plan_read(split: Split, schema_id: int, files: list[FileTask],
               needed: Sequence[str]) -> _GroupRead:
    file_schema = split.file_schemas[schema_id]
    by_id = {field_id(f): f for f in file_schema}

    physical: dict[str, str | None] = {}
    simple = True
    for name in needed:
        field = split.schema.field(name)
        old = by_id.get(field_id(field))
        physical[name] = old.name if old is not None else None
        if old is None or old.name != name or old.type != field.type:
            simple = False
    columns: list[str] | dict[str, pc.Expression]
    if simple:
        columns = list(needed)
    else:
        columns = {}
        for name in needed:
            typ = split.schema.field(name).type
            old_name = physical[name]
            if old_name is None:
                columns[name] = pc.scalar(pa.scalar(None, type=typ))
            else:
                expr = pc.field(old_name)
                if file_schema.field(old_name).type != typ:
                    expr = expr.cast(typ)
                columns[name] = expr

    pushed: pc.Expression | None = None
    residual: pc.Expression | None = None
    if not isinstance(split.filter, AlwaysTrue):
        to_push, kept = _pushable(split.filter, split.schema, file_schema, physical)
        refs = referenced_columns(to_push)
        if not isinstance(to_push, AlwaysTrue) and all(physical.get(c) is not None
                                                       for c in refs):
            mapping = {c: str(physical[c]) for c in refs if physical[c] != c}
            try:
                expr = rename_columns(to_push, mapping) if mapping else to_push
                pushed = to_arrow(expr, file_schema)
            except ValidationError:
                pushed = None
        if pushed is None:
            kept = split.filter
        if not isinstance(kept, AlwaysTrue):
            residual = to_arrow(kept, split.schema)
    read_columns = [c for c in physical.values() if c is not None]
    return _GroupRead(split.storage, files, file_schema, read_columns, columns, pushed, residual)


def _pushable(expr: Expr, schema: pa.Schema, file_schema: pa.Schema,
              physical: dict[str, str | None]) -> tuple[Expr, Expr]:
    """``(conjuncts pyarrow may prune row groups with, the rest)`` of a filter.

    Conjuncts on float columns are kept from pyarrow: Parquet row-group statistics leave NaN
    out and bound an all-zero group by ``[-0.0, 0.0]``, and pyarrow's pruning with them
    drops rows (``x != 1`` loses NaN rows, ``x IN (0.0)`` a group of zeros) and its
    ``count_rows`` counts rows that do not match (NaN under ``x <= 1``). They are applied to
    the rows read instead, with Arrow's own kernels; what pyarrow gets in their place is a
    range each one implies (:func:`_float_range`), so row groups are still pruned.
    """
    def floating(name: str) -> bool:
        old = physical.get(name)
        types = [schema.field(name).type] if name in schema.names else []
        if old is not None and old in file_schema.names:
            types.append(file_schema.field(old).type)
        return any(pa.types.is_floating(value_type(t)) for t in types)

    push: list[Expr] = []
    keep: list[Expr] = []
    for c in conjuncts(expr):
        if any(floating(n) for n in referenced_columns(c)):
            keep.append(c)
            implied = _float_range(c)
            if implied is not None:
                push.append(implied)
        else:
            push.append(c)
    return and_all(push), and_all(keep)


def _float_range(expr: Expr) -> Expr | None:
    """A filter that ``expr`` implies and that pyarrow prunes float row groups with correctly,
    or None. Ranges (``<``, ``<=``, ``>``, ``>=`` a number) are false for NaN like the rows'
    own test, so statistics without NaN bound them right, and they compare -0.0 and 0.0 by
    value; ``=`` becomes the range ``>= v AND <= v`` (pyarrow's equality pruning is not
    trusted with signed zeros); an OR (``IN`` on floats) keeps its branches only if each has
    a range; an AND keeps the branches that have one. The exact filter is applied to the rows
    after reading, so this only has to keep every row the filter is true for."""
    if isinstance(expr, Comparison) and isinstance(expr.right, Literal):
        value = expr.right.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return None
        if expr.op in ("<", "<=", ">", ">="):
            return expr
        if expr.op == "=":
            return And(Comparison(">=", expr.left, expr.right),
                       Comparison("<=", expr.left, expr.right))
        return None
    if isinstance(expr, Or):
        ranges = [_float_range(child) for child in expr.children]
        return None if any(r is None for r in ranges) else Or(*ranges)  # type: ignore[arg-type]
    if isinstance(expr, And):
        parts = [p for p in (_float_range(child) for child in expr.children) if p is not None]
        return and_all(parts) if parts else None
    return None


def _needed_columns(split: Split) -> tuple[list[str], bool]:
    needed = list(split.columns)
    extra = False
    if not isinstance(split.filter, AlwaysTrue):
        for c in sorted(referenced_columns(split.filter)):
            if c not in needed:
                needed.append(c)
                extra = True
    return needed, extra


def _finish(batch: pa.RecordBatch, group: _GroupRead, split: Split, extra: bool,
            out_schema: pa.Schema, filled: list[pa.Scalar] | None = None,
            built: dict[pa.Scalar, pa.Array] | None = None) -> pa.RecordBatch:
    if group.residual is not None:
        batch = batch.filter(group.residual)
    if KIND_COLUMN in batch.schema.names:
        batch = _inserts_where_unknown(batch)
    if filled:
        for name, value in zip(group.constants, filled, strict=True):
            batch = batch.append_column(name, _constant_slice(value, batch.num_rows, built))
    if extra or batch.schema.names != list(split.columns):
        batch = batch.select(list(split.columns))
    if batch.schema != out_schema:
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=out_schema)
    return batch


def _inserts_where_unknown(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its row kinds filled in where the file had none: a file written with
    deletion vectors (before the table's mode was switched to merge-on-read) holds only live
    rows, so each is an insert."""
    i = batch.schema.get_field_index(KIND_COLUMN)
    kinds = batch.column(i)
    if not kinds.null_count:
        return batch
    return batch.set_column(i, batch.schema.field(i),
                            pc.fill_null(kinds, pa.scalar(0, kinds.type)))


def _constant_slice(value: pa.Scalar, length: int,
                    built: dict[pa.Scalar, pa.Array] | None) -> pa.Array:
    """``length`` copies of ``value``: a zero-copy slice of the longest such array built so far
    in this read (batches of one file, and of files of one partition, repeat the value)."""
    if built is None:
        return constant_array(value, length)
    longest = built.get(value)
    if longest is None or len(longest) < length:
        longest = built[value] = constant_array(value, length)
    return longest.slice(0, length)


def limited(batches: Iterator[pa.RecordBatch], limit: int | None) -> Iterator[pa.RecordBatch]:
    """``batches`` without empty ones, stopping after ``limit`` rows (and the reading behind
    them, since the caller's generator is closed)."""
    remaining = limit
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if remaining is not None:
            if batch.num_rows >= remaining:
                yield batch.slice(0, remaining)
                return
            remaining -= batch.num_rows
        yield batch


def read_split(split: Split) -> Iterator[pa.RecordBatch]:
    """Yield the split's rows batch by batch (bounded memory)."""
    if split.merge is not None:
        return read_merged(split)
    return limited(_read_plain(split), split.limit)


@_checked
def _read_plain(split: Split) -> Iterator[pa.RecordBatch]:
    needed, extra = _needed_columns(split)
    if _constant_columns(split, split.files, needed):
        for _, batch in read_tagged(split):
            yield batch
        return
    out_schema = split.output_schema()
    for schema_id, files in _group_by_schema(split.files):
        group = _plan_group(split, schema_id, files, needed)
        for dataset in group.datasets():
            batches = dataset.to_batches(columns=group.columns, filter=group.filter,
                                         batch_size=split.batch_size, use_threads=True)
            for batch in batches:
                yield _finish(batch, group, split, extra, out_schema)
        for _, batch in _masked(split, group):
            yield _finish(batch, group, split, extra, out_schema)


def _with_deletes(files: Sequence[FileTask]) -> tuple[list[FileTask], list[FileTask]]:
    """``(files read whole, files with deleted rows)``."""
    plain = [f for f in files if f.deletes is None or not f.deletes.cardinality]
    masked = [f for f in files if f.deletes is not None and f.deletes.cardinality]
    return plain, masked


def _masked(split: Split, group: _GroupRead) -> Iterator[tuple[FileTask, pa.RecordBatch]]:
    """The live rows of the group's files that have a deletion vector (see
    :mod:`arrowlake.scan.deleted_rows`); :meth:`_GroupRead.datasets` leaves them out."""
    if not group.masked:
        return
    fs = split.storage.filesystem()

    def read(task: FileTask) -> list[pa.RecordBatch]:
        assert task.deletes is not None
        return list(live_batches(split.storage, task.path, task.deletes,
                                 _fragment(split.storage, fs, task), group.file_schema,
                                 group.read_columns, group.columns, group.filter,
                                 split.batch_size))

    for task, batches in _read_masked(split, group, read):
        for batch in batches:
            yield task, batch


def _read_masked(split: Split, group: _GroupRead, read: Callable[[FileTask], _R]
                 ) -> Iterator[tuple[FileTask, _R]]:
    """``read`` of each of the group's files with deleted rows, in order, read ahead: small
    local files in groups per thread, files on object stores one per thread."""
    if split.storage.high_latency:
        return read_ahead(group.masked, read)
    return read_ahead(group.masked, read, size=lambda task: task.file_size,
                      group_bytes=GROUP_BYTES)


#: The rows of files with deleted rows that a whole-table read filters in one pass.
_SELECT_ROWS = 1 << 20


def _masked_tables(split: Split, group: _GroupRead) -> Iterator[pa.Table]:
    """The live rows of the group's files that have a deletion vector, as :func:`_masked`
    gives them but not tagged by file: the rows of several files are filtered and projected
    together, up to :data:`_SELECT_ROWS` at a time."""
    if not group.masked:
        return
    fs = split.storage.filesystem()

    def read(task: FileTask) -> pa.Table | None:
        assert task.deletes is not None
        return read_live(split.storage, task.path, task.deletes,
                         _fragment(split.storage, fs, task), group.file_schema,
                         group.read_columns, group.filter)

    pending: list[pa.Table] = []
    rows = 0
    for _, table in _read_masked(split, group, read):
        if table is None:
            continue
        pending.append(table)
        rows += table.num_rows
        if rows >= _SELECT_ROWS:
            yield select_live(pa.concat_tables(pending), group.columns, group.filter)
            pending, rows = [], 0
    if pending:
        yield select_live(pa.concat_tables(pending), group.columns, group.filter)


@_checked
def read_tagged(split: Split) -> Iterator[tuple[FileTask, pa.RecordBatch]]:
    """The rows of a split without merging, each batch with the file it came from.

    All files are scanned together (concurrently, prefetched on object stores), where reading
    them one by one would pay each file's latency in turn. Partition columns are filled from
    each file's partition values rather than decoded.
    """
    needed, extra = _needed_columns(split)
    out_schema = split.output_schema()
    by_path = {split.storage.fs_path(f.path): f for f in split.files}
    cache: dict[tuple[str | None, str], pa.Scalar] = {}
    built: dict[pa.Scalar, pa.Array] = {}
    for schema_id, files in _group_by_schema(split.files):
        group = _plan_group(split, schema_id, files, needed)
        for dataset in group.datasets():
            scanner = dataset.scanner(columns=group.columns, filter=group.filter,
                                      batch_size=split.batch_size, use_threads=True)
            for tagged in scanner.scan_batches():
                batch = tagged.record_batch
                if not batch.num_rows:
                    continue
                task = by_path[tagged.fragment.path]
                filled = partition_scalars(split, task, group.constants, cache) \
                    if group.constants else None
                yield task, _finish(batch, group, split, extra, out_schema, filled, built)
        for task, batch in _masked(split, group):
            filled = partition_scalars(split, task, group.constants, cache) \
                if group.constants else None
            yield task, _finish(batch, group, split, extra, out_schema, filled, built)


@_checked
def read_split_table(split: Split) -> pa.Table:
    """All of the split's rows as one table (reads each schema group with threads)."""
    out_schema = split.output_schema()
    if split.merge is not None or split.limit is not None or \
            _constant_columns(split, split.files, _needed_columns(split)[0]):
        return pa.Table.from_batches(list(read_split(split)), schema=out_schema)
    needed, extra = _needed_columns(split)
    tables = []
    for schema_id, files in _group_by_schema(split.files):
        group = _plan_group(split, schema_id, files, needed)
        for dataset in group.datasets():
            # Threads only pay off past a few MB: a small change's file reads faster without
            # handing its few pages to the thread pools and back.
            table = dataset.to_table(columns=group.columns, filter=group.filter,
                                     batch_size=split.batch_size,
                                     use_threads=sum(f.file_size for f in files) > _THREADS_BYTES)
            if group.residual is not None:
                table = table.filter(group.residual)
            if extra or table.schema.names != list(split.columns):
                table = table.select(list(split.columns))
            tables.append(table.cast(out_schema) if table.schema != out_schema else table)
        masked = [_finish(batch, group, split, extra, out_schema)
                  for table in _masked_tables(split, group)
                  for batch in table.to_batches()]
        if masked:
            tables.append(pa.Table.from_batches(masked, schema=out_schema))
    if not tables:
        return out_schema.empty_table()
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


@_checked
def count_split(split: Split) -> int:
    """Rows of the split that match its filter, reading only what the filter needs."""
    if split.merge is not None:
        return sum(b.num_rows for b in read_split(split))
    narrowed = replace(split, columns=(), limit=None, merge=None)
    needed, _ = _needed_columns(narrowed)
    total = 0
    for schema_id, files in _group_by_schema(split.files):
        group = _plan_group(narrowed, schema_id, files, needed)
        for dataset in group.datasets():
            if group.residual is None:
                total += dataset.count_rows(filter=group.filter)
            else:
                table = dataset.to_table(columns=group.columns, filter=group.filter)
                total += table.filter(group.residual).num_rows
        for table in _masked_tables(split, group):
            total += table.num_rows if group.residual is None \
                else table.filter(group.residual).num_rows
    return total


# -- primary-key splits: each bucket's runs read, then merged by arrowlake.merge -----------


def bucket_groups(files: Sequence[FileTask]) -> list[list[FileTask]]:
    groups: dict[tuple[int | None, int | None], list[FileTask]] = {}
    for f in files:
        groups.setdefault((f.partition_id, f.bucket), []).append(f)
    return list(groups.values())


def needs_merge(files: Sequence[FileTask]) -> bool:
    """Whether a bucket's runs must be merged: not when they hold only additions and no two
    runs' key ranges overlap (a single run, or runs of disjoint keys), since every key then has
    exactly one version."""
    if not all(f.additions_only for f in files):
        return True
    if len(files) == 1:
        return False
    if any(f.key_range is None for f in files):
        return True
    ranges = sorted(f.key_range for f in files if f.key_range is not None)
    return any(prev[1] >= cur[0] for prev, cur in pairwise(ranges))


def _runs_split(split: Split, files: Sequence[FileTask], columns: Sequence[str],
                pushed: Expr, with_kind: bool = True) -> Split:
    schema = split.schema if KIND_COLUMN in split.schema.names else split.schema.append(
        KIND_FIELD)
    read = (*columns, KIND_COLUMN) if with_kind else tuple(columns)
    return replace(split, files=tuple(files), schema=schema, columns=read, filter=pushed,
                   limit=None, merge=None)


@_checked
def read_runs(split: Split, files: Sequence[FileTask], columns: Sequence[str],
              pushed: Expr, held: Mapping[int, pa.Table] | None = None) -> pa.Table:
    """The rows of ``files`` with ``_row_kind`` and ``_seq`` (the writing commit's sequence).

    ``held``: the whole rows of some of the files (by file id), in the split's schema with the
    stored row kind, which the caller already has decoded; only the others are read. (With
    ``held``, ``pushed`` must select every row: held rows are not filtered.)"""
    runs = _runs_split(split, files, columns, pushed)
    schema = runs.output_schema()
    usable = {fid: rows for fid, rows in (held or {}).items() if _holds(rows, schema)}
    by_file: dict[int, list[pa.RecordBatch]] = {}
    missing = [f for f in files if f.file_id not in usable]
    if missing:
        for task, batch in read_tagged(replace(runs, files=tuple(missing))):
            by_file.setdefault(task.file_id, []).append(batch)
    batches: list[pa.RecordBatch] = []
    seqs: list[int] = []
    for task in files:  # in the files' order, as one scan of them all yields them
        rows = usable.get(task.file_id)
        parts = by_file.get(task.file_id, []) if rows is None else pa.Table.from_arrays(
            [rows.column(name) for name in schema.names], schema=schema).to_batches()
        for batch in parts:
            batches.append(batch)
            seqs.append(task.seq_max or 0)
    return as_runs(batches, seqs, schema)


def _holds(rows: pa.Table, schema: pa.Schema) -> bool:
    """Whether ``rows`` have every column of ``schema``, in its types."""
    names = set(rows.column_names)
    return all(f.name in names and rows.schema.field(f.name).type == f.type for f in schema)


def _bucket_batches(split: Split, groups: list[list[FileTask]], columns: Sequence[str],
                    pushed: Expr) -> Iterator[Bucket]:
    """Each bucket's runs, read by one scan of all files.

    The scan yields files in order, so a bucket is complete when a later bucket's rows arrive;
    reading continues on Arrow's threads while complete buckets are merged.
    """
    files = [f for g in groups for f in g]
    if len({f.schema_id for f in files}) > 1:
        # Files of several schema versions are separate scans: read bucket by bucket.
        for group in groups:
            table = read_runs(split, group, columns, pushed)
            yield Bucket(group, [], [], table.schema, table.num_rows, table)
        return
    group_of = {f.file_id: i for i, g in enumerate(groups) for f in g}
    # Runs of additions only need no row kinds: a table without them is all inserts.
    runs = _runs_split(split, files, columns, pushed,
                       with_kind=not all(f.additions_only for f in files))
    schema = runs.output_schema()
    current = -1
    finished: set[int] = set()
    bucket: Bucket | None = None
    for task, batch in read_tagged(runs):
        index = group_of[task.file_id]
        if index != current:
            if index in finished:
                # Merging part of a bucket would return several versions of a key.
                raise ArrowlakeError(
                    f"The scan returned rows of {task.path} after other buckets' rows; a "
                    "bucket's runs must arrive together to be merged")
            if bucket is not None:
                yield bucket
            finished.add(current)
            current, bucket = index, Bucket(groups[index], [], [], schema)
        assert bucket is not None
        bucket.batches.append(batch)
        bucket.seqs.append(task.seq_max or 0)
        bucket.num_rows += batch.num_rows
    if bucket is not None:
        yield bucket


def merge_bucket(split: Split, files: Sequence[FileTask], columns: Sequence[str],
                 pushed: Expr, keep_retractions: bool = False,
                 held: Mapping[int, pa.Table] | None = None) -> pa.Table:
    """One bucket's current rows (with ``_row_kind`` and ``_seq``), merged; ``held`` as for
    :func:`read_runs`."""
    spec = split.merge
    assert spec is not None
    return merge_rows(spec, read_runs(split, files, columns, pushed, held), keep_retractions)


def _needed(split: Split, spec: MergeSpec, residual: Expr) -> list[str]:
    needed = list(split.columns)
    extra = [*spec.key, *sorted(referenced_columns(residual))]
    if spec.sequence_field:
        extra.append(spec.sequence_field)
    for c in extra:
        if c not in needed:
            needed.append(c)
    return needed


@_checked
def read_merged(split: Split) -> Iterator[pa.RecordBatch]:
    """Yield the merged rows of a primary-key split, bucket by bucket.

    Buckets whose runs need no merging (see :func:`needs_merge`) are read like an append
    table's files, all together and with the whole filter pushed down; the others are merged.
    """
    spec = split.merge
    assert spec is not None
    groups = bucket_groups(split.files)
    plain = [f for g in groups if not needs_merge(g) for f in g]
    merged = [g for g in groups if needs_merge(g)]
    batches = _merged_batches(split, spec, merged)
    if plain:
        direct = replace(split, files=tuple(plain), merge=None, limit=None)
        batches = chain(read_split(direct), batches)
    yield from limited(batches, split.limit)


def _merged_batches(split: Split, spec: MergeSpec, groups: list[list[FileTask]]
                    ) -> Iterator[pa.RecordBatch]:
    if not groups:
        return
    pushed, residual = split_filter(split.filter, spec.key)
    needed = _needed(split, spec, residual)
    out_schema = split.output_schema()
    # Partition columns are constant in a bucket: merge without them, then add them back to
    # the merged rows only (from the files' partition values; nothing is decoded).
    used = referenced_columns(split.filter)
    fill = [c for c in spec.partition_by if c in needed and c not in used]
    if not [k for k in spec.key if k not in spec.partition_by]:
        fill = []  # a key of partition columns only is sorted by them: they must be read
    fill = fillable(split.partition_by, [f for g in groups for f in g], fill)
    read_columns = [c for c in needed if c not in fill]
    cache: dict[tuple[str | None, str], pa.Scalar] = {}

    def finish(bucket: Bucket, merged: pa.Table) -> pa.Table:
        if fill:
            values = partition_scalars(split, bucket.files[0], fill, cache)
            for name, value in zip(fill, values, strict=True):
                merged = merged.append_column(name, constant_column(value, merged.num_rows))
        if not isinstance(residual, AlwaysTrue):
            merged = merged.filter(split_residual(residual, merged))
        merged = merged.select(list(split.columns))
        return merged if merged.schema == out_schema else merged.cast(out_schema)

    yield from merge_buckets(spec, _bucket_batches(split, groups, read_columns, pushed), finish,
                             split.batch_size)
