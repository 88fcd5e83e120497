"""Merge-on-read of primary-key tables: each bucket's runs, as the scan read them, merged.

A split of a primary-key table holds whole buckets. The scan (:mod:`arrowlake.scan.read`) reads
each bucket's runs (only the needed columns; filters on key columns pushed down, since they keep
or drop all versions of a key together) and hands them over as :class:`Bucket` objects, each
batch tagged with the sequence of the commit that wrote its run; here they are merged by the
table's merge engine. Filters on other columns are applied after the merge: pruning by them could
resurrect an older version of a key. Buckets are merged on a small thread pool, one ahead of the
consumer, so memory stays around two buckets.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from arrowlake.expressions import AlwaysTrue, Expr, and_all, conjuncts, evaluate, referenced_columns
from arrowlake.merge.engines import MergeEngine
from arrowlake.merge.runs import KIND_COLUMN
from arrowlake.merge.versions import ROW_KIND, SEQUENCE


@dataclass(frozen=True)
class MergeSpec:
    """How the runs of each bucket of a primary-key split are merged."""

    key: tuple[str, ...]
    engine: MergeEngine  # a picklable frozen dataclass
    sequence_field: str | None = None
    partition_by: tuple[str, ...] = ()  # part of the key, constant within a bucket's runs


def split_filter(expr: Expr, key: Sequence[str]) -> tuple[Expr, Expr]:
    """``(key-only conjuncts, the rest)`` of a filter."""
    keys = set(key)
    on_key: list[Expr] = []
    rest: list[Expr] = []
    for c in conjuncts(expr):
        (on_key if referenced_columns(c) <= keys else rest).append(c)
    return and_all(on_key), and_all(rest)


def as_runs(batches: Sequence[pa.RecordBatch], seqs: Sequence[int], schema: pa.Schema
            ) -> pa.Table:
    """The batches of one bucket as one table, with ``_seq`` (``seqs[i]`` for batch ``i``)."""
    rows = pa.Table.from_batches(batches, schema=schema)
    rows = rows.rename_columns([ROW_KIND if c == KIND_COLUMN else c for c in rows.column_names])
    seq = np.repeat(np.asarray(seqs, dtype=np.int64), [b.num_rows for b in batches])
    return rows.append_column(SEQUENCE, pa.array(seq))


@dataclass
class Bucket:
    """One bucket's runs as read: batches, each with the sequence of the run it came from."""

    files: list[Any]  # the reader's descriptions of the bucket's files, handed back to it
    batches: list[pa.RecordBatch]
    seqs: list[int]
    schema: pa.Schema
    num_rows: int = 0
    built: pa.Table | None = None  # already a table (read by a scan of its own)

    def table(self) -> pa.Table:
        """The rows as :func:`as_runs` gives them (built by the merge thread)."""
        if self.built is not None:
            return self.built
        return as_runs(self.batches, self.seqs, self.schema)


def merge_rows(spec: MergeSpec, rows: pa.Table, keep_retractions: bool = False) -> pa.Table:
    """One bucket's rows (with ``_row_kind`` and ``_seq``) merged by the table's engine."""
    return spec.engine.merge(rows, list(spec.key), spec.sequence_field, keep_retractions,
                             constant=spec.partition_by)


# Buckets smaller than this are merged together, up to this many rows in all: a merge has a
# fixed cost of some 0.1-0.5 ms, which selective reads (a key range over many buckets, each
# contributing a few rows) would otherwise pay once per bucket.
SMALL_BUCKET_ROWS = 32_768
UNIT_COLUMN = "_al_unit"


def merge_buckets(spec: MergeSpec, buckets: Iterable[Bucket],
                  finish: Callable[[Bucket, pa.Table], pa.Table], batch_size: int
                  ) -> Iterator[pa.RecordBatch]:
    """Merge each bucket, ``finish`` its merged rows (the caller adds what was not read and
    applies the rest of the filter) and yield them in batches of at most ``batch_size`` rows.

    Buckets are merged on the merge pool as they arrive, one ahead of the consumer; small ones
    are merged together (see :func:`merge_together`).
    """

    def work(buckets: list[Bucket]) -> pa.Table:
        if len(buckets) == 1:
            return finish(buckets[0], merge_rows(spec, buckets[0].table()))
        return pa.concat_tables([finish(b, part) for b, part in
                                 zip(buckets, merge_together(spec, buckets), strict=True)])

    pool = _merge_pool()
    ahead: deque[Future[pa.Table]] = deque()
    small: list[Bucket] = []
    small_rows = 0
    try:
        for bucket in buckets:
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
                yield from ahead.popleft().result().to_batches(max_chunksize=batch_size)
        if small:
            ahead.append(pool.submit(work, small))
        while ahead:
            yield from ahead.popleft().result().to_batches(max_chunksize=batch_size)
    finally:
        for future in ahead:
            future.cancel()
        for future in ahead:
            # A merge still running holds its bucket: let it finish before the read returns.
            with contextlib.suppress(Exception):
                future.result()


def merge_together(spec: MergeSpec, buckets: Sequence[Bucket]) -> list[pa.Table]:
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


def _forget_pool() -> None:
    """In a forked child (a DataLoader worker, say) the parent's pool has no threads: the
    child starts its own on first use."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def split_residual(residual: Expr, merged: pa.Table) -> pa.Array:
    if isinstance(residual, AlwaysTrue):
        return pa.array(np.ones(merged.num_rows, dtype=bool))
    return evaluate(residual, merged)

