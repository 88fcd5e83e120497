"""Decoded runs kept between writes, for the ``lookup`` changelog and compaction.

A lookup (:mod:`.changelog`) reads the runs a write touches, and a compaction merges a
bucket's runs; decoding them is most of a lookup's cost and a third of a compaction's in
``bench/pk.py``'s long run. A writer that keeps writing into a table would decode the runs it
just wrote: the process-wide cache here keeps the runs a writer writes (and those a lookup
decodes), bounded in bytes by the table property ``write.run-cache-size``
(``changelog.lookup-cache-size``, its older name, wins when set). It is on by default (256 MiB)
on ``lookup`` tables, where every write reads runs, and off on others: there it spares only
part of the compactions' decoding (2-5% of the long run's write time, measured) and holds its
memory for good. Data files are immutable and never reused under another name, so an entry
keyed by a file's location and the schema it was read in stays right until it is evicted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from arrowlake.io.lru import SizedLRU
from arrowlake.io.writer import DataFileWriter
from arrowlake.scan.split import FileTask
from arrowlake.table.options.primary_key import run_cache_bytes

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

@dataclass(frozen=True, eq=False)
class DecodedRun:
    """The rows of one data file in a table schema (table columns + stored row kind), each
    column one chunk, with its first key column as integers when the key type allows."""

    rows: pa.Table
    keys: np.ndarray | None
    sorted_unique: bool  # ``keys`` strictly increasing (a run: sorted, one row per key)

    @classmethod
    def of(cls, rows: pa.Table, first: str, fast: bool) -> DecodedRun:
        rows = rows.combine_chunks()
        keys = as_ints(rows.column(first)) if fast else None
        ordered = keys is not None and (len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])))
        return cls(rows, keys, ordered)


#: Decoded data files by (path, schema id), least recently used first out, bounded in bytes
#: by :func:`run_cache_bytes` of the table that fills it (see the module doc): a writer that
#: keeps upserting into a table decodes each run once, when it writes it, instead of at every
#: write that touches its bucket.
RUNS: SizedLRU[DecodedRun] = SizedLRU(0, lambda run: run.rows.nbytes)
os.register_at_fork(after_in_child=RUNS.after_fork)


def decoded_runs(table: TableState, written: Sequence[tuple[DataFileWriter, pa.Table]]
                 ) -> list[tuple[DataFileWriter, DecodedRun]]:
    """Each writer's rows as a run of its own memory."""
    first = table.record.primary_key[0]
    fast = integer_like(table.schema.field(first).type)
    return [(writer, DecodedRun.of(pa.Table.from_arrays([_own_rows(c) for c in rows.columns],
                                                        schema=rows.schema), first, fast))
            for writer, rows in written]


def _own_rows(column: pa.ChunkedArray) -> pa.Array:
    """``column`` as one array whose memory holds only its rows, so that the cache holds, and
    counts, only those: as it is when it already is one (a ``take`` builds such arrays), else
    copied (a run may be a slice of a whole write)."""
    if column.num_chunks == 1:
        chunk = column.chunk(0)
        if chunk.get_total_buffer_size() <= chunk.nbytes + chunk.nbytes // 8 + 64:
            return chunk
    return pa.concat_arrays(column.chunks)


def remember_runs(table: TableState, written: Sequence[tuple[DataFileWriter, pa.Table]]) -> None:
    """Keep the runs a write just wrote (each writer's rows, written as one file) decoded for
    the compactions and lookup changelogs of the next writes, so none reads them back."""
    if run_cache_bytes(table.record.properties):
        keep_runs(table, decoded_runs(table, written))


def keep_runs(table: TableState, runs: Sequence[tuple[DataFileWriter, DecodedRun]]) -> None:
    """Cache the runs whose writer wrote them as one (closed) file."""
    rec = table.record
    limit = run_cache_bytes(rec.properties)
    if not limit:
        return
    for writer, run in runs:
        if len(writer.files) != 1:
            continue  # rolled over into several files: none holds all the rows
        path = table.storage.join(rec.location, writer.files[0].path)
        RUNS.put((path, rec.current_schema_id), run, limit)


def integer_like(t: pa.DataType) -> bool:
    """Types whose values numpy orders as Arrow does (as integers)."""
    return (pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
            or pa.types.is_time(t) or pa.types.is_duration(t))


def as_ints(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_integer(values.type):
        width = values.type.bit_width
        values = values.view(pa.int32() if width == 32 else pa.int64())
    return np.asarray(values.to_numpy(zero_copy_only=False))


def held_runs(table: TableState, files: Sequence[FileTask]) -> dict[int, pa.Table]:
    """The whole rows of those of ``files`` the cache holds (table columns in the current
    schema and the stored row kind), by file id."""
    schema_id = table.record.current_schema_id
    held = {}
    for f in files:
        run = RUNS.get((f.path, schema_id))
        if run is not None:
            held[f.file_id] = run.rows
    return held
