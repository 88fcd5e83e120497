"""Decoded runs kept between writes, for the ``lookup`` changelog (:mod:`.changelog`).

A lookup needs the rows of the runs a write touches. Decoding them is most of its cost, and a
writer that keeps upserting into a table would decode the same runs at every write; the
process-wide cache here keeps them, bounded in bytes by the table property
``changelog.lookup-cache-size``. Data files are immutable and never reused under another name,
so an entry keyed by a file's location and the schema it was read in stays right until it is
evicted.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from arrowlake.errors import ValidationError
from arrowlake.io.writer import DataFileWriter

if TYPE_CHECKING:
    from arrowlake.table.table import Table

LOOKUP_CACHE_PROPERTY = "changelog.lookup-cache-size"
DEFAULT_LOOKUP_CACHE_BYTES = 256 * 1024 * 1024


def lookup_cache_bytes(props: Mapping[str, str]) -> int:
    """The table property ``changelog.lookup-cache-size``: how many bytes of decoded runs a
    ``lookup`` changelog may keep in memory between writes (default 256 MiB; 0 turns it off)."""
    value = props.get(LOOKUP_CACHE_PROPERTY)
    if value is None or str(value).strip() == "":
        return DEFAULT_LOOKUP_CACHE_BYTES
    try:
        number = int(str(value).strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ValidationError(
            f"Table property '{LOOKUP_CACHE_PROPERTY}' must be a number of bytes (0 or more), "
            f"not {value!r}")
    return number


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


class RunCache:
    """Decoded data files, least recently used first out, bounded in bytes (see the module
    doc): a writer that keeps upserting into a table decodes each run once, when it writes
    it, instead of at every write that touches its bucket."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, int], DecodedRun] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> DecodedRun | None:
        with self._lock:
            run = self._entries.get(key)
            if run is not None:
                self._entries.move_to_end(key)
            return run

    def put(self, key: tuple[str, int], run: DecodedRun, limit: int) -> None:
        size = run.rows.nbytes
        with self._lock:
            if key in self._entries or size > limit:
                return
            self._entries[key] = run
            self._bytes += size
            while self._bytes > limit:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.rows.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held while forking


RUNS = RunCache()
os.register_at_fork(after_in_child=RUNS.after_fork)


def decoded_runs(table: Table, written: Sequence[tuple[DataFileWriter, pa.Table]]
                 ) -> list[tuple[DataFileWriter, DecodedRun]]:
    """Each writer's rows as a run of its own memory."""
    first = table._record.primary_key[0]
    fast = integer_like(table.schema.field(first).type)
    # A run is a slice of the whole write: copied (a memcpy) so that the cache holds, and
    # counts, only its own rows.
    return [(writer, DecodedRun.of(pa.Table.from_arrays([pa.concat_arrays(c.chunks)
                                                   for c in rows.columns], schema=rows.schema),
                             first, fast))
            for writer, rows in written]


def keep_runs(table: Table, runs: Sequence[tuple[DataFileWriter, DecodedRun]]) -> None:
    """Cache the runs whose writer wrote them as one (closed) file."""
    rec = table._record
    limit = lookup_cache_bytes(rec.properties)
    if not limit:
        return
    for writer, run in runs:
        if len(writer.files) != 1:
            continue  # rolled over into several files: none holds all the rows
        path = table._storage.join(rec.location, writer.files[0].path)
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
