"""Writing data files: batches in, Parquet files with statistics out.

A :class:`FileSetWriter` routes batches to one :class:`DataFileWriter` per partition (and
bucket). Each buffers up to a row group, then compresses and writes it on a thread pool, so
partitions are written in parallel while the next input batch is split. Files roll over at the
target size. Nothing here touches the metastore: writers return :class:`NewFile` descriptions
for the commit, and on failure delete what they wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from arrowlake.errors import ValidationError
from arrowlake.io.pools import ContextPool
from arrowlake.io.stats import (
    column_stats_deferring,
    encode_partition_value,
    fill_deferred_bounds,
    merge_stats,
    partition_path,
    partition_shown,
)
from arrowlake.io.storage import Storage, discard_after_failure
from arrowlake.metastore.inflight import CURRENT_WRITE
from arrowlake.metastore.store import NewFile

_T = TypeVar("_T")

_EXECUTOR_LOCK = threading.Lock()
_EXECUTOR: ThreadPoolExecutor | None = None


def shared_executor() -> ThreadPoolExecutor:
    """The process-wide pool that compresses and writes row groups (pyarrow drops the GIL)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ContextPool(max_workers=max(2, os.cpu_count() or 2),
                                           thread_name_prefix="arrowlake-write")
        return _EXECUTOR


def _forget_executor() -> None:
    """In a forked child the parent's pool has no threads: the child starts its own."""
    global _EXECUTOR, _EXECUTOR_LOCK
    _EXECUTOR, _EXECUTOR_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_executor)


SORTED_RUN_ROW_GROUP_ROWS = 32_768
"""Row-group size of primary-key runs: a key-range read of a sorted run decodes one such
group instead of a whole 128k-row group, while full reads stay as fast (bench/pk.py)."""


@dataclass(frozen=True)
class WriteOptions:
    compression: str = "zstd"
    compression_level: int | None = None
    row_group_rows: int = 131_072
    target_file_bytes: int = 128 * 1024 * 1024
    buffer_bytes: int = 256 * 1024 * 1024
    encodings: str = "auto"  # ENCODING_POLICIES: see column_encodings

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, sorted_runs: bool = False
                        ) -> WriteOptions:
        """Options from table properties (a clear error for a malformed value). ``sorted_runs``
        (primary-key runs, sorted by key) defaults to smaller row groups: their min/max
        statistics then prune key ranges."""
        rows = SORTED_RUN_ROW_GROUP_ROWS if sorted_runs else cls.row_group_rows
        return cls(
            compression=_choice_property(props, "write.compression", _CODECS),
            compression_level=_int_property(props, "write.compression-level", 0,
                                            positive=False) or None,
            row_group_rows=_int_property(props, "write.row-group-rows", rows),
            target_file_bytes=_int_property(props, "write.target-file-size",
                                            cls.target_file_bytes),
            buffer_bytes=_int_property(props, "write.buffer-size", cls.buffer_bytes),
            encodings=_choice_property(props, "write.encodings", ENCODING_POLICIES),
        )


def _int_property(props: Mapping[str, str], name: str, default: int, *,
                  positive: bool = True) -> int:
    value = props.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or (positive and number <= 0):
        kind = "a positive integer" if positive else "an integer"
        raise ValidationError(f"Table property '{name}' must be {kind}, not {value!r}")
    return number


_CODECS = ("zstd", "snappy", "lz4", "gzip", "brotli", "none")


def _choice_property(props: Mapping[str, str], name: str, choices: Sequence[str]) -> str:
    """The property's value (case-insensitive) if it is one of ``choices`` (the first is the
    default), else a clear error."""
    value = props.get(name, choices[0])
    text = value.strip().lower()
    if text not in choices:
        raise ValidationError(f"Table property '{name}' must be one of "
                              f"{', '.join(choices)}, not {value!r}")
    return text


@dataclass(frozen=True)
class FileTarget:
    """Where and how one table's files are written."""

    storage: Storage
    location: str  # the table's location
    schema: pa.Schema  # the table schema (with field ids) the files are written in
    schema_id: int
    options: WriteOptions
    # The registration of the write in flight the files belong to (their names start with
    # it, see metastore/inflight.py): by default the one current where the target is made,
    # since the files themselves are written on the write pool's threads.
    write_id: str | None = dataclasses.field(default_factory=CURRENT_WRITE.get)


class DataFileWriter:
    """Writes the rows of one partition (and bucket) into one or more Parquet files."""

    def __init__(self, target: FileTarget, directory: str, *, partition_path: str | None = None,
                 partition_values: str | None = None, bucket: int | None = None,
                 file_hook: Callable[[pa.Table], dict[str, Any]] | None = None,
                 dictionary: Sequence[str] | None = None) -> None:
        """``dictionary``: the columns to dictionary-encode, when the caller already chose them
        for all the files of one write (:func:`dictionary_columns` of its rows); by default
        each writer samples its own first rows."""
        self.target = target
        self.directory = directory
        self.partition_path = partition_path
        self.partition_values = partition_values
        self.bucket = bucket
        self.file_hook = file_hook  # extra NewFile fields from the rows (key ranges, ...)
        self._buffer: list[pa.RecordBatch] = []
        self._buffered_rows = 0
        self.buffered_bytes = 0
        self._pending: Future[None] | None = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: pa.NativeFile | None = None
        self._path: str | None = None
        self._chunks: list[tuple[dict[str, list[Any]], int]] = []
        # Per chunk, the columns whose bounds come from the file's Parquet statistics.
        self._deferred: list[list[tuple[str, str]]] = []
        self._hook_chunks: list[pa.Table] = []
        self._rows = 0
        self._dictionary_columns: list[str] | None = None
        self._column_encoding: dict[str, str] = {}
        if dictionary is not None:
            self._choose_encodings(list(dictionary))
        self.written: list[str] = []  # absolute paths, for cleanup
        self.files: list[NewFile] = []

    @property
    def dictionary(self) -> list[str] | None:
        """The columns this writer dictionary-encodes (None until chosen)."""
        return self._dictionary_columns

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self._buffer.append(batch)
        self._buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self._buffered_rows >= self.target.options.row_group_rows:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered rows to the write pool (waiting for this writer's last flush)."""
        if not self._buffer:
            return
        table = pa.Table.from_batches(self._buffer)
        self._buffer, self._buffered_rows, self.buffered_bytes = [], 0, 0
        self._wait()
        self._pending = shared_executor().submit(self._write_table, table)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _open(self) -> None:
        name = f"{uuid.uuid4().hex}.parquet" if self.target.write_id is None else \
            f"{self.target.write_id}-{uuid.uuid4().hex[:16]}.parquet"
        rel = f"{self.directory}/{name}" if self.directory else name
        self._path = rel
        abs_path = self.target.storage.join(self.target.location, rel)
        self.written.append(abs_path)
        self._sink = self.target.storage.open_output(abs_path)
        opts = self.target.options
        self._writer = pq.ParquetWriter(
            self._sink, self.target.schema, compression=opts.compression,
            compression_level=opts.compression_level, write_statistics=True,
            use_dictionary=self._dictionary_columns or False,
            column_encoding=self._column_encoding or None,
        )

    def _choose_encodings(self, dictionary: list[str]) -> None:
        self._dictionary_columns = dictionary
        policy = self.target.options.encodings
        if policy != "plain":
            self._column_encoding = column_encodings(self.target.schema, dictionary, policy)

    def write_all(self, table: pa.Table) -> None:
        """Hand all of ``table`` to the write pool as one task (its row groups written in
        order), so the caller goes on, e.g. merging the next bucket, while it is written."""
        for batch in table.to_batches():
            if batch.num_rows:
                self._buffer.append(batch)
        self.flush()

    def _write_table(self, table: pa.Table) -> None:
        if self._writer is None and self._dictionary_columns is None:
            self._choose_encodings(dictionary_columns(table))
        rg = self.target.options.row_group_rows
        for start in range(0, table.num_rows, rg):
            self._write_row_group(table.slice(start, rg))

    def _write_row_group(self, table: pa.Table) -> None:
        if self._writer is None:
            self._open()
        assert self._writer is not None and self._sink is not None
        self._writer.write_table(table, row_group_size=table.num_rows)
        stats, deferred = column_stats_deferring(table, self.target.schema)
        self._chunks.append((stats, table.num_rows))
        self._deferred.append(deferred)
        if self.file_hook is not None:
            self._hook_chunks.append(table)
        self._rows += table.num_rows
        if self._sink.tell() >= self.target.options.target_file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is None:
            return
        assert self._sink is not None and self._path is not None
        self._writer.close()
        size = self._sink.tell()
        self._sink.close()
        if any(self._deferred):
            # The writer computed these bounds as it encoded the values (min_max would cost
            # as much again); without its metadata they stay unknown, which only prunes less.
            metadata = getattr(getattr(self._writer, "writer", None), "metadata", None)
            if metadata is not None:
                fill_deferred_bounds(self._chunks, self._deferred, metadata,
                                     self.target.schema)
        extra = self.file_hook(pa.concat_tables(self._hook_chunks)) if self.file_hook else {}
        self.files.append(NewFile(
            path=self._path, schema_id=self.target.schema_id, row_count=self._rows,
            file_size=size, stats=json.dumps(merge_stats(self._chunks, self.target.schema),
                             separators=(",", ":")),
            partition_path=self.partition_path, partition_values=self.partition_values,
            bucket=self.bucket, **extra,
        ))
        self._writer = self._sink = self._path = None
        self._chunks, self._deferred, self._hook_chunks, self._rows = [], [], [], 0

    def close(self) -> list[NewFile]:
        self.flush()
        self._wait()
        self._close_file()
        return self.files

    def abort(self) -> None:
        """Stop writing and delete every file written; the caller reports the original error."""
        with contextlib.suppress(Exception):
            self._wait()
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
            if self._sink is not None:
                self._sink.close()
        discard_after_failure(self.target.storage, self.written)


# Dictionary encoding pays when values repeat; on mostly-distinct columns the writer builds a
# dictionary, overflows its page limit and falls back to plain encoding, which makes writing
# about twice as slow and files larger. So each file samples its first rows and dictionary-
# encodes only the columns whose values repeat enough.
_DICT_SAMPLE_ROWS = 16_384
_DICT_MAX_DISTINCT_RATIO = 0.5


def dictionary_columns(table: pa.Table) -> list[str]:
    sample = table.slice(0, _DICT_SAMPLE_ROWS)
    n = sample.num_rows
    chosen = []
    for field in table.schema:
        t = field.type
        if (pa.types.is_nested(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
                or pa.types.is_floating(t)):
            continue  # measured values rarely repeat; booleans are bit-packed anyway
        col = sample.column(field.name)
        try:
            # The distinct values, null included: what count_distinct(mode="all") counts,
            # about twice as fast on one contiguous array.
            distinct = len(pc.unique(col.combine_chunks()))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            continue
        if n == 0 or distinct <= n * _DICT_MAX_DISTINCT_RATIO:
            chosen.append(field.name)
    return chosen


# Encodings for the columns that are not dictionary-encoded, by Arrow type (``write.encodings``).
# Measured on 2.5M rows of (sorted int64 id, 12-char string, random float64, random int64
# timestamp), zstd, 2 cores: a threaded read takes 0.080 s instead of 0.128 s with PLAIN, the
# write 0.34 s instead of 0.44 s, and the file is 45 MiB instead of 54 MiB. Delta-encoded
# integers leave zstd little to decompress (sorted keys almost nothing).
#
# - ``auto`` (the default): integers and temporals DELTA_BINARY_PACKED, strings and binaries
#   DELTA_LENGTH_BYTE_ARRAY, floats PLAIN. Every reader arrowlake claims decodes these: Spark's
#   vectorized Parquet reader from 3.4 (so every PySpark >= 4.1), Iceberg's Spark runtime for
#   Spark 4.1 (its vectorized reader has both since 1.11), DuckDB, Polars, pyarrow 16+.
# - ``byte-stream-split``: ``auto`` with BYTE_STREAM_SPLIT floats, which decode about twice as
#   fast in pyarrow and are smaller for noisy measurements (2.5M random float64: 16.5 MiB
#   instead of 17.9; a float32 random walk 6.8 instead of 8.3) but larger for decimal-like
#   values (prices with two decimals: 13.1 MiB instead of 7.8). Spark's vectorized reader
#   decodes it only from 4.3 (4.1 and 4.2 fail with "Unsupported encoding: BYTE_STREAM_SPLIT";
#   arrowlake.spark.read sends such files through the data source there), Iceberg's from 1.11.
#   Until this became opt-in, ``auto`` wrote it: files of that time have it too.
# - ``plain``: PLAIN (and dictionaries) only, for readers older than all of the above.
ENCODING_POLICIES = ("auto", "byte-stream-split", "plain")


def column_encodings(schema: pa.Schema, dictionary: Sequence[str], policy: str = "auto"
                     ) -> dict[str, str]:
    """Parquet encodings for the top-level primitive columns not in ``dictionary``, by the
    ``write.encodings`` policy (``auto`` or ``byte-stream-split``; see ENCODING_POLICIES)."""
    t = pa.types
    chosen = {}
    skip = set(dictionary)
    split_floats = policy == "byte-stream-split"
    for field in schema:
        typ = field.type
        if field.name in skip or "." in field.name:
            continue  # dotted names would address nested leaves in the writer's options
        if (t.is_integer(typ) or t.is_date(typ) or t.is_timestamp(typ) or t.is_time(typ)
                or t.is_duration(typ)):
            chosen[field.name] = "DELTA_BINARY_PACKED"
        elif split_floats and (t.is_float32(typ) or t.is_float64(typ)):
            chosen[field.name] = "BYTE_STREAM_SPLIT"
        elif (t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ)
              or t.is_large_binary(typ)):
            chosen[field.name] = "DELTA_LENGTH_BYTE_ARRAY"
    return chosen


def split_by_columns(
    batch: pa.RecordBatch, columns: Sequence[str]
) -> list[tuple[tuple[pa.Scalar, ...], pa.RecordBatch]]:
    """Split ``batch`` into groups of equal values in ``columns`` (vectorized).

    Returns ``(the group's values, rows)`` per group. Few groups are cut out with masks; many are
    cut from one sort by group code.
    """
    if not columns:
        return [((), batch)]
    codes: pa.Array | None = None
    for name in columns:
        enc = pc.dictionary_encode(batch.column(name), null_encoding="encode")
        idx = enc.indices.cast(pa.int64())
        codes = idx if codes is None else pc.add(pc.multiply(codes, len(enc.dictionary)), idx)
    assert codes is not None
    unique = pc.unique(codes)
    groups: list[tuple[tuple[pa.Scalar, ...], pa.RecordBatch]] = []
    if len(unique) == 1:
        parts = [batch]
    elif len(unique) <= 8:
        parts = [batch.filter(pc.equal(codes, code)) for code in unique]
    else:
        order = pc.sort_indices(codes)
        sorted_batch = batch.take(order)
        sorted_codes = codes.take(order)
        change = pc.not_equal(sorted_codes[1:], sorted_codes[:-1])
        starts = [0] + [int(i) + 1 for i in pc.indices_nonzero(change).to_pylist()]
        ends = [*starts[1:], batch.num_rows]
        parts = [sorted_batch.slice(s, e - s) for s, e in zip(starts, ends, strict=True)]
    for part in parts:
        groups.append((tuple(part.column(name)[0] for name in columns), part))
    return groups


class FileSetWriter:
    """Writes a stream of batches of one table into files, one writer per partition."""

    def __init__(self, target: FileTarget, partition_by: Sequence[str] = (),
                 *, directory: str = "data") -> None:
        self.target = target
        self.partition_by = list(partition_by)
        self.directory = directory
        self._writers: dict[str, DataFileWriter] = {}

    def _writer_for(self, values: tuple[pa.Scalar, ...]) -> DataFileWriter:
        # Keyed by the stored JSON form, which is also what the metastore records.
        key = json.dumps([encode_partition_value(v) for v in values])
        writer = self._writers.get(key)
        if writer is None:
            shown = [partition_shown(v) for v in values]
            ppath = partition_path(self.partition_by, shown) if self.partition_by else None
            directory = f"{self.directory}/{ppath}" if ppath else self.directory
            writer = DataFileWriter(
                self.target, directory, partition_path=ppath,
                partition_values=key if self.partition_by else None)
            self._writers[key] = writer
        return writer

    def write(self, batch: pa.RecordBatch) -> None:
        # Large batches are cut to row-group size so that splitting the next slice overlaps
        # with compressing the previous one on the write pool.
        step = self.target.options.row_group_rows
        if batch.num_rows > step:
            for start in range(0, batch.num_rows, step):
                self.write(batch.slice(start, step))
            return
        for key, part in split_by_columns(batch, self.partition_by):
            self._writer_for(key).write(part)
        if sum(w.buffered_bytes for w in self._writers.values()) > self.target.options.buffer_bytes:
            for w in self._writers.values():
                w.flush()

    def close(self) -> list[NewFile]:
        return close_all(list(self._writers.values()))

    def abort(self) -> None:
        for w in self._writers.values():
            w.abort()


def close_all(writers: Sequence[DataFileWriter]) -> list[NewFile]:
    """Finish every writer and return their files (all writers share one storage)."""
    for w in writers:
        w.flush()
    if len(writers) <= 1 or not writers[0].target.storage.high_latency:
        return [f for w in writers for f in w.close()]
    # Finishing a file on an object store is a request (the upload's completion): finish them
    # all at once, on a pool of their own since closing waits for tasks on the shared one.
    with ContextPool(max_workers=min(len(writers), 16),
                            thread_name_prefix="arrowlake-close") as pool:
        return [f for files in pool.map(DataFileWriter.close, writers) for f in files]


def write_started(start: Callable[[list[DataFileWriter]], _T]) -> tuple[list[NewFile], _T]:
    """Call ``start``, which hands rows to writers it appends to the list it is given, then
    finish every writer; ``(their files, what start returned)``. On any error every writer is
    aborted (its files deleted) and the error re-raised."""
    writers: list[DataFileWriter] = []
    try:
        started = start(writers)
        return close_all(writers), started
    except BaseException:
        for writer in writers:
            writer.abort()
        raise


def write_batches(target: FileTarget, batches: Iterable[pa.RecordBatch],
                  partition_by: Sequence[str] = ()) -> list[NewFile]:
    """Write all ``batches`` and return the files; on any error, delete them and re-raise."""
    writer = FileSetWriter(target, partition_by)
    try:
        for batch in batches:
            writer.write(batch)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
