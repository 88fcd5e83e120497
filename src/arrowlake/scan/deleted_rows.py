"""Reading files that have a deletion vector: their rows minus the deleted positions.

Positions are row numbers within a file, so rows inside a row group are not filtered while
a file with a vector is read (a filter would shift the positions): row groups are still
skipped by their statistics against the filter, the ones kept are read in one threaded read
(they come back in file order, each starting at the position its footer gives), and the
deleted positions (a boolean mask over the rows read, numpy over the vector's sorted
positions) and the filter are applied in one pass, with the same dataset expression a plain
read pushes down, so both give the same rows; then the projection.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from arrowlake.errors import DataFileError
from arrowlake.io.deletion_vectors import VectorRef, keep_mask
from arrowlake.io.storage import Storage

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Files with deleted rows read at once, ahead of the one being consumed: each is read whole
#: (its positions must line up), and a bucket holds many small ones between compactions, so
#: reading them one after the other would wait on each file's open and footer in turn.
READ_AHEAD = 4


def read_ahead(items: Sequence[_T], read: Callable[[_T], _R], ahead: int = READ_AHEAD
               ) -> Iterator[tuple[_T, _R]]:
    """``(item, read(item))`` for each item in order, up to ``ahead`` of them read at once on
    threads of their own."""
    if len(items) <= 1:
        for item in items:
            yield item, read(item)
        return
    with ThreadPoolExecutor(max_workers=min(ahead, len(items)),
                            thread_name_prefix="arrowlake-masked") as pool:
        pending: deque[tuple[_T, Future[_R]]] = deque()
        upcoming = iter(items)
        try:
            for item in upcoming:
                pending.append((item, pool.submit(read, item)))
                if len(pending) >= ahead:
                    break
            while pending:
                item, future = pending.popleft()
                following = next(upcoming, None)
                if following is not None:
                    pending.append((following, pool.submit(read, following)))
                yield item, future.result()
        finally:
            for _, future in pending:
                future.cancel()


def row_group_starts(fragment: ds.ParquetFileFragment) -> np.ndarray:
    """The position of each row group's first row in its file."""
    metadata = fragment.metadata
    counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))


def live_batches(storage: Storage, path: str, deletes: VectorRef,
                 fragment: ds.ParquetFileFragment,
                 file_schema: pa.Schema, read_columns: Sequence[str],
                 columns: list[str] | dict[str, pc.Expression], filter: pc.Expression | None,
                 batch_size: int) -> Iterator[pa.RecordBatch]:
    """The rows of one file that its vector does not delete, filtered by ``filter`` and
    projected to ``columns`` (both in the file's own column names, as a plain read takes
    them)."""
    deleted = deletes.positions(storage, path)
    starts = row_group_starts(fragment)
    if filter is not None:
        kept = [piece.row_groups[0].id
                for piece in fragment.split_by_row_group(filter, schema=file_schema)]
        if not kept:
            return
        if len(kept) < len(starts) - 1:
            fragment = fragment.subset(row_group_ids=kept)
    else:
        kept = list(range(len(starts) - 1))
    names = list(dict.fromkeys(read_columns))
    # One threaded read of the row groups kept, which come back in file order.
    rows = fragment.to_table(columns=names, schema=file_schema, use_threads=True)
    groups = np.asarray(kept, dtype=np.int64)
    lengths = starts[groups + 1] - starts[groups]
    if int(lengths.sum()) != rows.num_rows:
        raise DataFileError(f"{path} holds {rows.num_rows} rows in the row groups read, "
                            f"its footer says {int(lengths.sum())}")
    mask = _kept_rows(deleted, starts, groups, lengths)
    if filter is not None and isinstance(columns, list):
        # The deleted rows and the filter's in one pass over the rows read (the alive mask
        # as a column), then the projection.
        if mask is not None:
            rows = rows.append_column(_ALIVE, pa.array(mask))
            filter = filter & ds.field(_ALIVE)
        rows = rows.filter(filter).select(columns)
        if rows.num_rows:
            yield from rows.to_batches(max_chunksize=batch_size)
        return
    if mask is not None:
        rows = rows.filter(pa.array(mask))
    if rows.num_rows == 0:
        return
    if filter is None and isinstance(columns, list) and columns == names:
        yield from rows.to_batches(max_chunksize=batch_size)
        return
    # The same projection and filter a plain read pushes into the file, applied to the rows
    # left.
    yield from ds.dataset(rows).to_batches(columns=columns, filter=filter,
                                           batch_size=batch_size, use_threads=True)


#: The column that carries the alive mask through a filter (no file column is named so:
#: arrowlake's own columns do not start with two underscores).
_ALIVE = "__arrowlake_alive"


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
