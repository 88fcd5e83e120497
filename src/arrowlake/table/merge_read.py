"""Merge-on-read of primary-key tables, inside the IO layer.

A split of a primary-key table holds whole buckets. Each bucket's runs are read (only the needed
columns; filters on key columns pushed down, since they keep or drop all versions of a key
together), tagged with the sequence of the commit that wrote them, and merged by the table's
merge engine. Filters on other columns are applied after the merge: pruning by them could
resurrect an older version of a key. Buckets are merged on a small thread pool, one ahead of the
consumer, so memory stays around two buckets.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain, pairwise

import numpy as np
import pyarrow as pa

from arrowlake.errors import ArrowlakeError
from arrowlake.expressions import AlwaysTrue, Expr, and_all, conjuncts, referenced_columns
from arrowlake.scan.read import (
    constant_column,
    fillable,
    limited,
    partition_scalars,
    read_tagged,
)
from arrowlake.scan.split import FileTask, MergeSpec, Split
from arrowlake.table.merging import ROW_KIND, SEQUENCE

KIND_COLUMN = "_al_row_kind"


def split_filter(expr: Expr, key: Sequence[str]) -> tuple[Expr, Expr]:
    """``(key-only conjuncts, the rest)`` of a filter."""
    keys = set(key)
    on_key: list[Expr] = []
    rest: list[Expr] = []
    for c in conjuncts(expr):
        (on_key if referenced_columns(c) <= keys else rest).append(c)
    return and_all(on_key), and_all(rest)


def bucket_groups(files: Sequence[FileTask]) -> list[list[FileTask]]:
    groups: dict[tuple[int | None, int | None], list[FileTask]] = {}
    for f in files:
        groups.setdefault((f.partition_id, f.bucket), []).append(f)
    return list(groups.values())


def _runs_split(split: Split, files: Sequence[FileTask], columns: Sequence[str],
                pushed: Expr, with_kind: bool = True) -> Split:
    from arrowlake.table.primary_key import KIND_FIELD

    schema = split.schema if KIND_COLUMN in split.schema.names else split.schema.append(
        KIND_FIELD)
    read = (*columns, KIND_COLUMN) if with_kind else tuple(columns)
    return Split(split.storage, tuple(files), split.file_schemas, schema, read, pushed,
                 batch_size=split.batch_size, partition_by=split.partition_by, table=split.table)


def _as_runs(batches: Sequence[pa.RecordBatch], seqs: Sequence[int], schema: pa.Schema
             ) -> pa.Table:
    """The batches of one bucket as one table, with ``_seq`` (``seqs[i]`` for batch ``i``)."""
    rows = pa.Table.from_batches(batches, schema=schema)
    rows = rows.rename_columns([ROW_KIND if c == KIND_COLUMN else c for c in rows.column_names])
    seq = np.repeat(np.asarray(seqs, dtype=np.int64), [b.num_rows for b in batches])
    return rows.append_column(SEQUENCE, pa.array(seq))


def read_runs(split: Split, files: Sequence[FileTask], columns: Sequence[str],
              pushed: Expr) -> pa.Table:
    """The rows of ``files`` with ``_row_kind`` and ``_seq`` (the writing commit's sequence)."""
    runs = _runs_split(split, files, columns, pushed)
    batches: list[pa.RecordBatch] = []
    seqs: list[int] = []
    for task, batch in read_tagged(runs):
        batches.append(batch)
        seqs.append(task.seq_max or 0)
    return _as_runs(batches, seqs, runs.output_schema())


@dataclass
class _Bucket:
    """One bucket's runs as read: batches, each with the sequence of the run it came from."""

    files: list[FileTask]
    batches: list[pa.RecordBatch]
    seqs: list[int]
    schema: pa.Schema
    num_rows: int = 0
    built: pa.Table | None = None  # already a table (read by a scan of its own)

    def table(self) -> pa.Table:
        """The rows as :func:`read_runs` gives them (built by the merge thread)."""
        if self.built is not None:
            return self.built
        return _as_runs(self.batches, self.seqs, self.schema)


def _bucket_batches(split: Split, groups: list[list[FileTask]], columns: Sequence[str],
                    pushed: Expr) -> Iterator[_Bucket]:
    """Each bucket's runs, read by one scan of all files.

    The scan yields files in order, so a bucket is complete when a later bucket's rows arrive;
    reading continues on Arrow's threads while complete buckets are merged.
    """
    files = [f for g in groups for f in g]
    if len({f.schema_id for f in files}) > 1:
        # Files of several schema versions are separate scans: read bucket by bucket.
        for group in groups:
            table = read_runs(split, group, columns, pushed)
            yield _Bucket(group, [], [], table.schema, table.num_rows, table)
        return
    group_of = {f.file_id: i for i, g in enumerate(groups) for f in g}
    # Runs of additions only need no row kinds: a table without them is all inserts.
    runs = _runs_split(split, files, columns, pushed,
                       with_kind=not all(f.additions_only for f in files))
    schema = runs.output_schema()
    current = -1
    finished: set[int] = set()
    bucket: _Bucket | None = None
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
            current, bucket = index, _Bucket(groups[index], [], [], schema)
        assert bucket is not None
        bucket.batches.append(batch)
        bucket.seqs.append(task.seq_max or 0)
        bucket.num_rows += batch.num_rows
    if bucket is not None:
        yield bucket


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


def merge_bucket(split: Split, files: Sequence[FileTask], columns: Sequence[str],
                 pushed: Expr, keep_retractions: bool = False) -> pa.Table:
    """One bucket's current rows (with ``_row_kind`` and ``_seq``), merged."""
    spec = split.merge
    assert spec is not None
    return merge_rows(spec, read_runs(split, files, columns, pushed), keep_retractions)


def merge_rows(spec: MergeSpec, rows: pa.Table, keep_retractions: bool = False) -> pa.Table:
    """One bucket's rows (with ``_row_kind`` and ``_seq``) merged by the table's engine."""
    return spec.engine.merge(rows, list(spec.key), spec.sequence_field, keep_retractions,
                             constant=spec.partition_by)


def _needed(split: Split, spec: MergeSpec, residual: Expr) -> list[str]:
    needed = list(split.columns)
    extra = [*spec.key, *sorted(referenced_columns(residual))]
    if spec.sequence_field:
        extra.append(spec.sequence_field)
    for c in extra:
        if c not in needed:
            needed.append(c)
    return needed


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
        from arrowlake.scan.read import read_split

        direct = replace(split, files=tuple(plain), merge=None, limit=None)
        batches = chain(read_split(direct), batches)
    yield from limited(batches, split.limit)


# Buckets smaller than this are merged together, up to this many rows in all: a merge has a
# fixed cost of some 0.1-0.5 ms, which selective reads (a key range over many buckets, each
# contributing a few rows) would otherwise pay once per bucket.
SMALL_BUCKET_ROWS = 32_768
UNIT_COLUMN = "_al_unit"


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

    def finish(files: list[FileTask], merged: pa.Table) -> pa.Table:
        if fill:
            values = partition_scalars(split, files[0], fill, cache)
            for name, value in zip(fill, values, strict=True):
                merged = merged.append_column(name, constant_column(value, merged.num_rows))
        if not isinstance(residual, AlwaysTrue):
            merged = merged.filter(split_residual(residual, merged))
        merged = merged.select(list(split.columns))
        return merged if merged.schema == out_schema else merged.cast(out_schema)

    def work(buckets: list[_Bucket]) -> pa.Table:
        if len(buckets) == 1:
            return finish(buckets[0].files, merge_rows(spec, buckets[0].table()))
        return pa.concat_tables([finish(b.files, part) for b, part in
                                 zip(buckets, merge_together(spec, buckets), strict=True)])

    pool = _merge_pool()
    ahead: deque[Future[pa.Table]] = deque()
    small: list[_Bucket] = []
    small_rows = 0
    try:
        for bucket in _bucket_batches(split, groups, read_columns, pushed):
            if bucket.num_rows >= SMALL_BUCKET_ROWS:
                ahead.append(pool.submit(work, [bucket]))
            else:
                small.append(bucket)
                small_rows += bucket.num_rows
                if small_rows >= SMALL_BUCKET_ROWS:
                    ahead.append(pool.submit(work, small))
                    small, small_rows = [], 0
            del bucket
            while len(ahead) > 1:
                yield from ahead.popleft().result().to_batches(max_chunksize=split.batch_size)
        if small:
            ahead.append(pool.submit(work, small))
        while ahead:
            yield from ahead.popleft().result().to_batches(max_chunksize=split.batch_size)
    finally:
        for future in ahead:
            future.cancel()
        for future in ahead:
            # A merge still running holds its bucket: let it finish before the read returns.
            with contextlib.suppress(Exception):
                future.result()


def merge_together(spec: MergeSpec, buckets: Sequence[_Bucket]) -> list[pa.Table]:
    """Merge several buckets in one call, as if each were merged alone: rows are tagged with
    their bucket's position, which leads the sort key, so no two buckets' keys meet (two
    partitions' buckets can hold the same key values once partition columns are left out)."""
    tables = []
    for unit, bucket in enumerate(buckets):
        table = bucket.table()
        tables.append(table.append_column(
            UNIT_COLUMN, pa.array(np.full(table.num_rows, unit, np.int32))))
    rows = pa.concat_tables(tables)
    merged = spec.engine.merge(rows, [UNIT_COLUMN, *spec.key], spec.sequence_field,
                               constant=spec.partition_by)
    units = merged[UNIT_COLUMN].to_numpy()
    merged = merged.drop_columns([UNIT_COLUMN])
    if len(units) > 1 and not bool(np.all(units[1:] >= units[:-1])):
        order = np.argsort(units, kind="stable")
        units, merged = units[order], merged.take(pa.array(order))
    bounds = np.searchsorted(units, np.arange(len(buckets) + 1))
    return [merged.slice(int(lo), int(hi - lo)) for lo, hi in pairwise(bounds)]


_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def _merge_pool() -> ThreadPoolExecutor:
    """The process-wide pool that merges buckets (numpy and Arrow release the GIL), kept
    between reads: starting threads for every read cost more than merging a small bucket.
    Two threads: one bucket merging while the next is, and the reader keeps the cores busy."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="arrowlake-merge")
        return _POOL


def split_residual(residual: Expr, merged: pa.Table) -> pa.Array:
    from arrowlake.expressions import evaluate

    if isinstance(residual, AlwaysTrue):
        return pa.array(np.ones(merged.num_rows, dtype=bool))
    return evaluate(residual, merged)


def with_merge(split: Split, merge: MergeSpec) -> Split:
    return replace(split, merge=merge)
