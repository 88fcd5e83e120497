"""Reading files that have a deletion vector: their rows minus the deleted positions.

Positions are row numbers within a file, so a file with a vector is read row group by row
group: row groups are still skipped by their statistics against the filter (each kept row
group starts at a position the footer gives), but rows inside a row group are not filtered
while reading, since a filter would shift the positions. The deleted positions are dropped
with one boolean mask per batch (numpy over the vector's sorted positions), then the filter
and projection are applied to what is left, with the same dataset expressions a plain read
pushes down, so both give the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from arrowlake.io.deletion_vectors import keep_mask
from arrowlake.io.storage import Storage

if TYPE_CHECKING:
    from arrowlake.scan.split import FileTask


def row_group_starts(fragment: ds.ParquetFileFragment) -> np.ndarray:
    """The position of each row group's first row in its file."""
    metadata = fragment.metadata
    counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))


def live_batches(storage: Storage, task: FileTask, fragment: ds.ParquetFileFragment,
                 file_schema: pa.Schema, read_columns: Sequence[str],
                 columns: list[str] | dict[str, pc.Expression], filter: pc.Expression | None,
                 batch_size: int) -> Iterator[pa.RecordBatch]:
    """The rows of one file that its vector does not delete, filtered by ``filter`` and
    projected to ``columns`` (both in the file's own column names, as a plain read takes
    them)."""
    assert task.deletes is not None
    deleted = task.deletes.positions(storage, task.path)
    starts = row_group_starts(fragment)
    pieces = fragment.split_by_row_group(filter, schema=file_schema) if filter is not None \
        else fragment.split_by_row_group(schema=file_schema)
    names = list(dict.fromkeys(read_columns))
    for piece in pieces:
        start = int(starts[piece.row_groups[0].id])
        offset = start
        for batch in piece.to_batches(columns=names, schema=file_schema, batch_size=batch_size,
                                      use_threads=False):
            mask = keep_mask(deleted, offset, batch.num_rows)
            offset += batch.num_rows
            if mask is not None:
                batch = batch.filter(pa.array(mask))
            if batch.num_rows == 0:
                continue
            if filter is None and isinstance(columns, list) and columns == names:
                yield batch
                continue
            # The same projection and filter a plain read pushes into the file, applied to
            # the rows left.
            view = ds.dataset(pa.Table.from_batches([batch]))
            yield from view.to_batches(columns=columns, filter=filter, use_threads=False)
