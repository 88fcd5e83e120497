"""Reading files that have a deletion vector: their rows minus the deleted positions.

Positions are row numbers within a file, so rows inside a row group are not filtered while
a file with a vector is read (a filter would shift the positions): row groups are still
skipped by their statistics against the filter, and the ones kept are read in one call
(local files through Parquet's reader with the footer already parsed; on object stores
through the dataset read, which coalesces the requests), each starting at the position its
footer gives. The deleted positions become a boolean column over the rows read (numpy over
the vector's sorted positions), and the alive mask and the filter are applied in one pass
(:func:`select_live`), with the same dataset expression a plain read pushes down, so both
give the same rows; then the projection. A whole-table read applies that pass once to the
rows of many files (a filter pass per small file costs more than the filtering itself).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from arrowlake.errors import DataFileError
from arrowlake.io.deletion_vectors import VectorRef, keep_mask
from arrowlake.io.lru import SizedLRU
from arrowlake.io.storage import Storage
from arrowlake.scan.grouping import consecutive_groups

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Groups of files with deleted rows read at once, ahead of the one being consumed: each file
#: is read whole (its positions must line up), and a bucket holds many small ones between
#: compactions, so reading them one after the other would wait on each file's open and footer
#: in turn.
READ_AHEAD = 4

#: Bytes of consecutive small local files one thread reads in one go. A run's file between
#: compactions decodes in a fraction of a millisecond, about what handing it to a thread and
#: back costs with the GIL contended, so one task per file was slower than reading them all
#: on the calling thread (bench/pk.py's range read: 32 ms with a task per file, 25 ms in
#: groups). Files on object stores are read one per task: their latency is what overlaps.
GROUP_BYTES = 2 << 20


def read_ahead(items: Sequence[_T], read: Callable[[_T], _R], ahead: int = READ_AHEAD,
               size: Callable[[_T], int] | None = None, group_bytes: int = 0
               ) -> Iterator[tuple[_T, _R]]:
    """``(item, read(item))`` for each item in order, up to ``ahead`` of them read at once on
    threads of their own.

    With ``size`` and ``group_bytes``, consecutive items are read in groups of up to
    ``group_bytes`` (by ``size``), one group per task, and up to ``ahead`` groups at once on
    as many threads as the machine has cores (at most ``ahead``).
    """
    grouped = size is not None and group_bytes > 0
    groups = consecutive_groups(items, size, group_bytes) if size is not None and grouped \
        else [[item] for item in items]
    if len(groups) <= 1:
        for item in items:
            yield item, read(item)
        return
    workers = min(ahead, len(groups), (os.cpu_count() or 1) if grouped else ahead)

    def read_group(group: list[_T]) -> list[_R]:
        return [read(item) for item in group]

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arrowlake-masked") as pool:
        pending: deque[tuple[list[_T], Future[list[_R]]]] = deque()
        upcoming = iter(groups)
        try:
            for group in upcoming:
                pending.append((group, pool.submit(read_group, group)))
                if len(pending) >= ahead:
                    break
            while pending:
                group, future = pending.popleft()
                following = next(upcoming, None)
                if following is not None:
                    pending.append((following, pool.submit(read_group, following)))
                yield from zip(group, future.result(), strict=True)
        finally:
            for _, future in pending:
                future.cancel()


#: Row group starts of recently read files, by path (data files are never rewritten).
_STARTS: SizedLRU[np.ndarray] = SizedLRU(1 << 20, lambda starts: starts.nbytes)
os.register_at_fork(after_in_child=_STARTS.after_fork)


def row_group_starts(fragment: ds.ParquetFileFragment) -> np.ndarray:
    """The position of each row group's first row in its file (read-only)."""
    starts = _STARTS.get(fragment.path)
    if starts is not None:
        return starts
    metadata = fragment.metadata
    counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    starts.flags.writeable = False
    _STARTS.put(fragment.path, starts)
    return starts


def read_live(storage: Storage, path: str, deletes: VectorRef,
              fragment: ds.ParquetFileFragment, file_schema: pa.Schema,
              read_columns: Sequence[str], filter: pc.Expression | None) -> pa.Table | None:
    """The rows of one file's row groups that ``filter`` may match (by their statistics), in
    file order, with the columns ``read_columns`` (typed as in ``file_schema``) and a last
    column, :data:`ALIVE`, true for the rows its vector does not delete; None when no row
    group may match. :func:`select_live` takes it (or several of them concatenated) on."""
    deleted = deletes.positions(storage, path)
    starts = row_group_starts(fragment)
    groups = len(starts) - 1
    if filter is not None and groups > 1:
        kept = [piece.row_groups[0].id
                for piece in fragment.split_by_row_group(filter, schema=file_schema)]
        if not kept:
            return None
    else:
        # One row group: planning kept the file by its statistics already, and reading it
        # costs less than asking the footer's again (the filter drops its rows either way).
        kept = list(range(groups))
    names = list(dict.fromkeys(read_columns))
    types = pa.schema([file_schema.field(n) for n in names])
    if storage.high_latency:
        # The dataset read fetches the column chunks of the kept row groups in a few
        # coalesced requests.
        subset = fragment if len(kept) == groups else fragment.subset(row_group_ids=kept)
        rows = subset.to_table(columns=names, schema=file_schema, use_threads=True)
    else:
        # A local file: Parquet's own reader with the footer already parsed, without the
        # dataset machinery (a scan plan per file costs as much as decoding a small one), and
        # without pre-buffering, which on a local file costs a third of reading a row group.
        with fragment.filesystem.open_input_file(fragment.path) as source:
            rows = pq.ParquetFile(source, metadata=fragment.metadata,
                                  pre_buffer=False).read_row_groups(
                kept, columns=names, use_threads=False)
        if rows.schema != types:
            rows = rows.cast(types)
    chosen = np.asarray(kept, dtype=np.int64)
    lengths = starts[chosen + 1] - starts[chosen]
    if int(lengths.sum()) != rows.num_rows:
        raise DataFileError(f"{path} holds {rows.num_rows} rows in the row groups read, "
                            f"its footer says {int(lengths.sum())}")
    mask = _kept_rows(deleted, starts, chosen, lengths)
    alive = pa.array(np.ones(rows.num_rows, dtype=bool) if mask is None else mask)
    return rows.append_column(ALIVE, alive)


def select_live(rows: pa.Table, columns: list[str] | dict[str, pc.Expression],
                filter: pc.Expression | None) -> pa.Table:
    """The rows of :func:`read_live` tables (one, or several of one schema concatenated)
    that are alive and match ``filter``, projected to ``columns``: the same filter and
    projection, in the files' own column names, that a plain read pushes down, so both give
    the same rows."""
    if filter is not None and isinstance(columns, list):
        # The deleted rows and the filter's in one pass, then the projection.
        return rows.filter(filter & ds.field(ALIVE)).select(columns)
    alive = rows[ALIVE]
    # Row groups read may hold no deleted row: then nothing is copied to drop none.
    rows = rows.drop_columns([ALIVE]) if pc.all(alive).as_py() else \
        rows.filter(alive).drop_columns([ALIVE])
    if filter is None and isinstance(columns, list) and columns == rows.column_names:
        return rows
    return ds.dataset(rows).to_table(columns=columns, filter=filter)


def live_batches(storage: Storage, path: str, deletes: VectorRef,
                 fragment: ds.ParquetFileFragment,
                 file_schema: pa.Schema, read_columns: Sequence[str],
                 columns: list[str] | dict[str, pc.Expression], filter: pc.Expression | None,
                 batch_size: int) -> Iterator[pa.RecordBatch]:
    """The rows of one file that its vector does not delete, filtered by ``filter`` and
    projected to ``columns`` (both in the file's own column names, as a plain read takes
    them)."""
    rows = read_live(storage, path, deletes, fragment, file_schema, read_columns, filter)
    if rows is None:
        return
    rows = select_live(rows, columns, filter)
    if rows.num_rows:
        yield from rows.to_batches(max_chunksize=batch_size)


#: The column that carries the alive mask through a filter (no file column is named so:
#: arrowlake's own columns do not start with two underscores).
ALIVE = "__arrowlake_alive"


def _kept_rows(deleted: np.ndarray, starts: np.ndarray, groups: np.ndarray,
               lengths: np.ndarray) -> np.ndarray | None:
    """True for each row read (the row groups ``groups``, in file order) that ``deleted``
    does not name; None when none is deleted."""
    if len(groups) == len(starts) - 1:
        return keep_mask(deleted, 0, int(starts[-1]))
    masks = [keep_mask(deleted, int(starts[g]), int(n)) for g, n in zip(groups, lengths,
                                                                        strict=True)]
    if all(m is None for m in masks):
        return None
    return np.concatenate([np.ones(int(n), dtype=bool) if m is None else m
                           for m, n in zip(masks, lengths, strict=True)])
