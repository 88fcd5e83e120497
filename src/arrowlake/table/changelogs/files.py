"""Changelog files of primary-key tables: their schema (the table's columns and a row kind),
writing them one file per partition and bucket, and the row differences they hold.

Lookup changelogs in format 2 refer to the rows of their snapshot's runs instead of copying
them (:data:`AFTER_COLUMN`); the producers themselves are in
:mod:`arrowlake.table.changelogs.producers` and :mod:`arrowlake.table.changelogs.lookup`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
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
from arrowlake.merge import ROW_KIND, RowKind
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.equality import same_rows
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD, KIND_FIELD_ID
from arrowlake.metastore.store import NewFile
from arrowlake.schema import FIELD_ID_KEY
from arrowlake.table.keys.lookup import match_keys

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


INDEX_COLUMN = "__al_row"

#: Lookup changelogs in format 2 (written when a key's merged row is its newest version:
#: ``deduplicate`` without a sequence field or ``ignore-delete``, a one-column integer-like key)
#: copy no row that the runs of their snapshot hold. Per partition and bucket, a changelog file
#: (possibly none) holds, in key order, the ``-U`` rows, each with AFTER_COLUMN: the position,
#: among the rows of the runs the snapshot added there (the runs in key order), of its new row,
#: read right after it as ``+U``; the ``-D`` rows (AFTER_COLUMN null); and, with the row kind
#: UNCHANGED and null values, the positions of new rows that changed nothing. Every other
#: addition of those runs (a row that is not a retraction) is read after them as ``+I``, in
#: run order. Snapshots whose summary lacks REFERENCING_SUMMARY hold every row's values
#: (format 1, still read as such; the other lookup paths write it too).
AFTER_COLUMN = "_al_after"
UNCHANGED = -1
AFTER_FIELD_ID = KIND_FIELD_ID + 1
AFTER_FIELD = pa.field(AFTER_COLUMN, pa.int32(), nullable=True,
                       metadata={FIELD_ID_KEY: str(AFTER_FIELD_ID).encode()})
#: The snapshot summary entry that marks a lookup changelog in format 2.
REFERENCING_SUMMARY = "changelog-format"
REFERENCING_FORMAT = 2


def log_schema(schema: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """The schema of format-2 lookup changelog files of a table schema: its columns, non-key
    ones nullable (null in UNCHANGED rows), the row kind and AFTER_COLUMN."""
    keys = set(key)
    fields = [f if f.name in keys else f.with_nullable(True) for f in schema]
    return pa.schema(fields, metadata=schema.metadata).append(KIND_FIELD).append(AFTER_FIELD)


def write_changelog(table: TableState, rows: pa.Table) -> list[NewFile]:
    """``rows`` (table columns + ``_row_kind`` codes) as changelog files, one per partition and
    bucket, rows in input order."""
    return write_parts(table, bucketed(table, rows))


# A changelog file's place and rows: (partition path, partition values JSON, bucket, rows with
# table columns + ``_row_kind`` codes).
Part = tuple[str | None, str | None, int, pa.Table]


def write_parts(table: TableState, parts: Iterable[Part], *, referencing: bool = False
                 ) -> list[NewFile]:
    """One changelog file per part, each handed to the write pool as soon as it is cut, so the
    next part is computed while it is written. ``referencing``: lookup format 2 (see
    :data:`AFTER_COLUMN`)."""
    files, _ = write_started(
        lambda writers: start_parts(table, parts, writers, referencing=referencing))
    return files


def start_parts(table: TableState, parts: Iterable[Part], writers: list[DataFileWriter], *,
                 referencing: bool = False, dictionary: Sequence[str] | None = None) -> None:
    """Hand each part to the write pool as a changelog file, its writer appended to ``writers``
    (the caller closes them, or aborts them on an error). ``referencing``: in lookup format 2,
    with AFTER_COLUMN. ``dictionary``: the columns to
    dictionary-encode when already chosen (the write's runs hold the same columns' values),
    else chosen from the first part."""
    rec = table.record
    schema = log_schema(table.schema, rec.primary_key) if referencing \
        else table.schema.append(KIND_FIELD)
    target = FileTarget(storage=table.storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties))
    dictionary = list(dictionary) if dictionary is not None else None
    for ppath, pvalues, bucket, rows in parts:
        if rows.num_rows == 0:
            continue
        rows = rows.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                    for c in rows.column_names])
        out = pa.Table.from_arrays(rows.select(schema.names).columns, schema=schema)
        if dictionary is None:
            # One choice of encodings for all the files of the write. In format 2, made on the
            # rows with values (the null values of markers would look like repeats).
            dictionary = dictionary_columns(own_rows(out)) if referencing \
                else dictionary_columns(out)
        directory = "/".join(p for p in ("changelog", ppath, f"bucket-{bucket}") if p)
        writer = DataFileWriter(target, directory, partition_path=ppath,
                                partition_values=pvalues, bucket=bucket,
                                dictionary=dictionary)
        writers.append(writer)
        writer.write_all(out)


def own_rows(rows: pa.Table) -> pa.Table:
    """A sample of the format-2 changelog rows that hold values (not UNCHANGED markers),
    without the position column."""
    sample = rows.slice(0, 65_536)  # dictionary_columns samples the first 16,384 of these
    return sample.filter(pc.not_equal(sample.column(KIND_COLUMN), UNCHANGED)).drop_columns(
        [AFTER_COLUMN])


def pair_keys(left: pa.Table, right: pa.Table, key: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row index pairs ``(i, j)`` with equal keys (keys are unique on each side)."""
    if left.num_rows == 0 or right.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(key) == 1:
        # One hash lookup of each left key among the right ones (cheaper than a join).
        try:
            at = pc.index_in(left.column(key[0]),
                             value_set=right.column(key[0]).combine_chunks())
        except pa.ArrowNotImplementedError:
            pass  # no kernel for the key's type: the join below
        else:
            i = np.flatnonzero(at.is_valid().to_numpy(zero_copy_only=False))
            return i, np.asarray(at.drop_null().to_numpy(zero_copy_only=False), np.int64)
    a = left.select(list(key)).append_column(
        INDEX_COLUMN, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    b = right.select(list(key)).append_column(
        INDEX_COLUMN + "r", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = a.join(b, keys=list(key), join_type="inner")
    return (joined.column(INDEX_COLUMN).to_numpy(), joined.column(INDEX_COLUMN + "r").to_numpy())


def bucketed(table: TableState, rows: pa.Table) -> Iterator[Part]:
    """``rows`` cut by partition and bucket, each part in input order."""
    rec = table.record
    buckets = int(rec.buckets or 1)  # set for every primary-key table
    with_bucket = rows.append_column("_al_bucket",
                                     bucket_of(rows, list(rec.primary_key), buckets))
    as_batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in with_bucket.columns],
                                          schema=with_bucket.schema)
    for values, part in split_by_columns(as_batch, [*rec.partition_by, "_al_bucket"]):
        shown = [partition_shown(v) for v in values[:-1]]
        ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
        pvalues = json.dumps([encode_partition_value(v) for v in values[:-1]]) \
            if rec.partition_by else None
        table_part = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) \
            else part
        yield ppath, pvalues, int(values[-1].as_py()), table_part.drop_columns(["_al_bucket"])


def diff(before: pa.Table, after: pa.Table, key: Sequence[str]) -> pa.Table:
    """What turns ``before`` into ``after`` (both one merged row per key): ``-U``/``+U`` for
    changed rows, ``-D`` for keys gone, ``+I`` for new keys (table columns + ``_row_kind``)."""
    ib, ia = pair_keys(before, after, key)
    gone = np.ones(before.num_rows, dtype=bool)
    gone[ib] = False
    new = np.ones(after.num_rows, dtype=bool)
    new[ia] = False
    b_pair, a_pair = before.take(pa.array(ib)), after.take(pa.array(ia))
    changed = ~same_rows(b_pair, a_pair)
    return change_rows(b_pair.filter(pa.array(changed)), a_pair.filter(pa.array(changed)),
                    before.filter(pa.array(gone)), after.filter(pa.array(new)))


def change_rows(old_rows: pa.Table, new_rows: pa.Table, gone: pa.Table, inserted: pa.Table,
                *, deletes_first: bool = False) -> pa.Table:
    """The change rows (table columns + ``_row_kind``): ``-U`` old / ``+U`` new per updated
    key, interleaved so each before-image directly precedes its new row, then ``-D`` for
    ``gone`` (before the updates with ``deletes_first``) and ``+I`` for ``inserted``."""
    n = old_rows.num_rows
    updates = pa.concat_tables([old_rows, new_rows.cast(old_rows.schema)])
    order = np.empty(2 * n, dtype=np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n, 2 * n)
    updates = updates.take(pa.array(order))
    kinds = np.empty(2 * n, dtype=np.int8)
    kinds[0::2] = int(RowKind.UPDATE_BEFORE)
    kinds[1::2] = int(RowKind.UPDATE_AFTER)
    out = [updates.append_column(ROW_KIND, pa.array(kinds))]
    for part, kind in ((gone.cast(old_rows.schema), RowKind.DELETE),
                       (inserted.cast(old_rows.schema), RowKind.INSERT)):
        out.append(part.append_column(
            ROW_KIND, pa.array(np.full(part.num_rows, int(kind), dtype=np.int8))))
    if deletes_first:
        out[:2] = out[1::-1]
    return pa.concat_tables(out)


def labelled_change(before: pa.Table, after: pa.Table, key: Sequence[str]) -> pa.Table:
    """The rows a write retracted (``before``) and added (``after``, the same columns), paired
    by ``key`` (table columns + ``_row_kind``): ``-D`` rows first, then each ``-U`` directly
    before its ``+U``, then ``+I`` rows. A key written again with every value as it was is no
    change (as the lookup producer of merge-on-read tables and the net change of catch-up have
    it). Streams of merge-on-write tables label a snapshot's vectors and new files so, and the
    ``lookup`` producer of such tables writes the same at write time. :func:`diff` of two
    states, with the deletions first."""
    at_after, at_before = match_keys(after, before, list(key))
    replaced_before = np.zeros(before.num_rows, dtype=bool)
    replaced_before[at_before] = True
    replaced_after = np.zeros(after.num_rows, dtype=bool)
    replaced_after[at_after] = True
    old, new = before.take(pa.array(at_before)), after.take(pa.array(at_after))
    changed = pa.array(~same_rows(old, new.cast(before.schema)))
    return change_rows(old.filter(changed), new.filter(changed),
                       before.filter(pa.array(~replaced_before)),
                       after.filter(pa.array(~replaced_after)), deletes_first=True)
