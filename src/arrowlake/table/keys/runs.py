"""Sorted runs: a primary-key write's rows cut into one run per partition and bucket (unique
keys, sorted, versions within the write resolved by the merge engine), written as files in
their bucket folders."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.io.stats import encode_partition_value, partition_path, partition_shown
from arrowlake.io.writer import (
    DataFileWriter,
    FileTarget,
    WriteOptions,
    dictionary_columns,
    split_by_columns,
    write_started,
)
from arrowlake.merge import (
    ROW_KIND,
    MergeEngine,
    dedupe_within_write,
)
from arrowlake.merge.engines import cut_groups
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD, key_json
from arrowlake.metastore.store import NewFile
from arrowlake.scan.read import constant_column
from arrowlake.table.keys.run_cache import remember_runs
from arrowlake.table.options.primary_key import DEFAULT_BUCKETS, merge_engine, sequence_field

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

def _run_schema(table: TableState) -> pa.Schema:
    return table.schema.append(KIND_FIELD)


def _run_groups(rows: pa.Table, key: list[str], partition_by: list[str], buckets: int,
                engine: MergeEngine, seq_field: str | None
                ) -> Iterable[tuple[tuple[pa.Scalar, ...], int, pa.Table]]:
    """``rows`` as one run per partition and bucket: ``(partition values, bucket, run)``, each
    run sorted by key with unique keys (:func:`dedupe_within_write`)."""
    # Each row's partition as a small integer: its partition values' dictionary codes.
    pcodes = None
    width = 1
    for name in partition_by:
        encoded = pc.dictionary_encode(rows.column(name).combine_chunks(),
                                       null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pcodes = codes if pcodes is None else pcodes + width * codes
        width *= max(len(encoded.dictionary), 1)
    bucket, groups = cut_groups(rows, key, buckets, pcodes, engine, constant=partition_by)
    if groups is not None:
        # No key repeats within a group, nothing to merge: one sort of the whole write, then
        # a take per group (what deduplicating each group would give), so that the write pool
        # encodes a group while the next one is taken.
        # Partition columns are constant in a group: built from its value, not taken.
        order, starts, group_codes = groups
        ends = np.append(starts[1:], len(order))
        body = rows.drop_columns(partition_by)
        for lo, hi, code in zip(starts.tolist(), ends.tolist(), group_codes.tolist(),
                                strict=True):
            taken = body.take(pa.array(order[lo:hi]))
            values = tuple(rows.column(name)[int(order[lo])] for name in partition_by)
            constants = dict(zip(partition_by, values, strict=True))
            run = pa.Table.from_arrays(
                [constant_column(constants[f.name], hi - lo) if f.name in constants
                 else taken.column(f.name) for f in rows.schema], schema=rows.schema)
            yield values, code % buckets, run
        return
    with_bucket = rows.append_column("_al_bucket", bucket)
    as_batch = pa.RecordBatch.from_arrays(
        [c.combine_chunks() for c in with_bucket.columns], schema=with_bucket.schema)
    for values, part in split_by_columns(as_batch, [*partition_by, "_al_bucket"]):
        table = pa.Table.from_batches([part]).drop_columns(["_al_bucket"])
        # Partition columns are constant here: sorting by the rest is the same order.
        yield values[:-1], int(values[-1].as_py()), dedupe_within_write(
            table, key, engine, seq_field, constant=partition_by)


def write_runs(table: TableState, rows: pa.Table) -> list[NewFile]:
    """Write ``rows`` (table schema + ``_row_kind``) as one sorted run per partition and bucket."""
    files, written = write_started(lambda writers: start_runs(table, rows, writers))
    remember_runs(table, written)
    return files


def start_runs(table: TableState, rows: pa.Table, writers: list[DataFileWriter]
                ) -> list[tuple[DataFileWriter, pa.Table]]:
    """Hand ``rows`` to the write pool as one sorted run per partition and bucket, each
    writer appended to ``writers`` (the caller closes them, or aborts them on an error);
    returns each writer with its run's rows."""
    return start_group_writers(table, run_groups(table, rows), _run_schema(table), writers)


def run_groups(table: TableState, rows: pa.Table
               ) -> Iterable[tuple[tuple[pa.Scalar, ...], int, pa.Table]]:
    """``rows`` (table schema + ``_row_kind``) as ``(partition values, bucket, run)``, each
    run sorted by key with unique keys, versions within the write resolved by the engine."""
    rec = table.record
    return _run_groups(rows, list(rec.primary_key), list(rec.partition_by),
                       int(rec.buckets or DEFAULT_BUCKETS), merge_engine(table),
                       sequence_field(table))


def start_group_writers(table: TableState,
                        groups: Iterable[tuple[Sequence[pa.Scalar], int, pa.Table]],
                        schema: pa.Schema, writers: list[DataFileWriter],
                        dictionary: Sequence[str] | None = None
                        ) -> list[tuple[DataFileWriter, pa.Table]]:
    """Hand each group's rows (sorted by key) to the write pool as one file in its partition's
    bucket folder, in ``schema`` (with the row-kind column when it has one). ``dictionary``:
    the columns to dictionary-encode, chosen on the first group's rows when not given."""
    rec = table.record
    key = list(rec.primary_key)
    target = FileTarget(storage=table.storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties, sorted_runs=True))
    written: list[tuple[DataFileWriter, pa.Table]] = []
    for values, bucket, run in groups:
        run = run.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                  for c in run.column_names]).select(schema.names)
        run = pa.Table.from_arrays(run.columns, schema=schema)
        if dictionary is None:
            # One choice of encodings for all the write's runs, not a sample per file.
            dictionary = dictionary_columns(run)
        shown = [partition_shown(v) for v in values]
        ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
        directory = "/".join(p for p in ("data", ppath, f"bucket-{bucket}") if p)
        writer = DataFileWriter(
            target, directory, partition_path=ppath,
            partition_values=json.dumps([encode_partition_value(v) for v in values])
            if rec.partition_by else None,
            bucket=bucket,
            file_hook=lambda t: {"key_min": key_json(t.slice(0, 1), key),
                                 "key_max": key_json(t.slice(t.num_rows - 1, 1), key)},
            dictionary=dictionary)
        writers.append(writer)
        # The pool writes this run while the next one is cut.
        writer.write_all(run)
        written.append((writer, run))
    return written


