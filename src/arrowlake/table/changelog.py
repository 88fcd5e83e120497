"""Changelog producers of primary-key tables: changelog files written with each commit.

The table property ``changelog-producer`` (``create_table(..., changelog_producer=...)``)
decides what change streams read for a snapshot of a primary-key table:

- ``none`` (default): no changelog files; streams read the runs as written.
- ``input``: the input rows exactly as given to ``upsert``/``write_changes``/``merge``/
  ``delete`` (duplicates and ``-U`` rows included, before the write merged repeated keys),
  one changelog file per partition and bucket, in input order.
- ``lookup``: exact changes with before-images, computed at write time. The current rows of the
  keys a write touches are read (only the touched buckets' runs, files pruned by key range, read
  and merged by the ordinary merge-on-read), and again with the new runs merged in; the two are
  compared per key, vectorized: ``+I`` new key, ``-U`` old / ``+U`` new row where any value
  changed, ``-D`` with the deleted row's values, nothing where no value changed. Both reads use
  the table's merge engine, so every engine is exact (partial-update and aggregation emit the
  merged row). When another commit touching the same buckets lands first, the changelog is
  computed again on top of it before the commit (the runs are kept).

- ``full-compaction``: writes yield nothing; ``compact(full=True)`` commits the difference
  between the merged table at the previous full compaction and now (``+I``, ``-U``/``+U``,
  ``-D``), see :func:`full_compaction_changelog`.

Changelog files are recorded with the commit (``SnapshotChange.changelog``): read by their
snapshot only, never part of a scan, and deleted when that snapshot expires.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.expressions import AlwaysTrue, Expr, and_all, col
from arrowlake.io.stats import encode_partition_value, partition_path
from arrowlake.io.writer import (
    DataFileWriter,
    FileTarget,
    WriteOptions,
    close_all,
    split_by_columns,
)
from arrowlake.merge import ROW_KIND, SEQUENCE, RowKind
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import file_schemas, file_tasks
from arrowlake.scan.split import FileTask, Split
from arrowlake.table.writes import WriteResult, _discard, _result, commit_files

if TYPE_CHECKING:
    from arrowlake.table.table import Table

PRODUCERS = ("none", "input", "lookup", "full-compaction")
_INDEX = "__al_row"


def changelog_producer(table: Table) -> str:
    return table._record.properties.get("changelog-producer", "none")


def check_producer(value: object, primary_key: Sequence[str]) -> str:
    if value not in PRODUCERS:
        raise ValidationError(
            f"Unknown changelog_producer {value!r}; valid ones are {', '.join(PRODUCERS)}")
    if value != "none" and not primary_key:
        raise ValidationError(
            "changelog_producer needs a primary-key table: append tables' streams are exact "
            "without one")
    return str(value)


def _write(table: Table, rows: pa.Table) -> list[NewFile]:
    """``rows`` (table columns + ``_row_kind`` codes) as changelog files, one per partition and
    bucket, rows in input order."""
    rec = table._record
    schema = table.schema.append(KIND_FIELD)
    target = FileTarget(storage=table._storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties))
    buckets = int(rec.buckets or 1)  # set for every primary-key table
    rows = rows.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                for c in rows.column_names])
    with_bucket = rows.append_column("_al_bucket",
                                     bucket_of(rows, list(rec.primary_key), buckets))
    as_batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in with_bucket.columns],
                                          schema=with_bucket.schema)
    files: list[NewFile] = []
    writers: list[DataFileWriter] = []
    try:
        for values, part in split_by_columns(as_batch, [*rec.partition_by, "_al_bucket"]):
            table_part = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) \
                else part
            bucket = int(values[-1].as_py())
            shown = [v.as_py() if v.is_valid else None for v in values[:-1]]
            ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
            directory = "/".join(p for p in ("changelog", ppath, f"bucket-{bucket}") if p)
            writer = DataFileWriter(
                target, directory, partition_path=ppath,
                partition_values=json.dumps([encode_partition_value(v) for v in values[:-1]])
                if rec.partition_by else None, bucket=bucket)
            writers.append(writer)
            out = pa.Table.from_arrays(table_part.select(schema.names).columns, schema=schema)
            for batch in out.to_batches():
                writer.write(batch)
            writer.flush()
        files = close_all(writers)
    except BaseException:
        for writer in writers:
            writer.abort()
        _discard(table, files)
        raise
    return files


# -- lookup -----------------------------------------------------------------------------------


def _new_tasks(table: Table, runs: Sequence[NewFile], seq: int) -> list[FileTask]:
    """The written (not yet committed) runs as file tasks ordered after every committed run."""
    storage, loc = table._storage, table._record.location
    pids = {path: pid for pid, path, _ in table._metastore.partitions(table._record.table_id)}
    fresh = iter(range(-1, -(1 << 30), -1))
    for f in runs:
        if f.partition_path is not None and f.partition_path not in pids:
            pids[f.partition_path] = next(fresh)  # a new partition: no committed runs in it
    return [
        FileTask(-1 - i, storage.join(loc, f.path), f.file_size, f.row_count, f.schema_id,
                 f.bucket, seq, seq, pids.get(f.partition_path) if f.partition_path else None,
                 None, False, f.partition_values)
        for i, f in enumerate(runs)
    ]


def _merged(table: Table, base: int | None, tasks: Sequence[FileTask], expr: Expr) -> pa.Table:
    view = table._view(base, current_schema=True)
    if not tasks:
        return view.schema.empty_table()
    schemas = {sid: s.append(KIND_FIELD) for sid, s in file_schemas(view, tasks).items()}
    split = Split(view.storage, tuple(tasks), schemas, view.schema, tuple(view.schema.names),
                  expr, None, table._merge_spec(),
                  partition_by=tuple(table._record.partition_by))
    return split.to_arrow()


def _stored(table: Table, base: int | None, tasks: Sequence[FileTask]) -> pa.Table:
    """The rows of just-written runs as stored, with their row kinds in ``_row_kind``."""
    view = table._view(base, current_schema=True)
    schema = view.schema.append(KIND_FIELD)
    schemas = {sid: s.append(KIND_FIELD) for sid, s in file_schemas(view, tasks).items()}
    split = Split(view.storage, tuple(tasks), schemas, schema, tuple(schema.names),
                  AlwaysTrue(), None, None, partition_by=tuple(table._record.partition_by))
    rows = split.to_arrow()
    return rows.rename_columns([ROW_KIND if c == KIND_COLUMN else c
                                for c in rows.column_names])


def _pairs(left: pa.Table, right: pa.Table, key: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row index pairs ``(i, j)`` with equal keys (keys are unique on each side)."""
    if left.num_rows == 0 or right.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    a = left.select(list(key)).append_column(
        _INDEX, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    b = right.select(list(key)).append_column(
        _INDEX + "r", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    joined = a.join(b, keys=list(key), join_type="inner")
    return (joined.column(_INDEX).to_numpy(), joined.column(_INDEX + "r").to_numpy())


def _same(before: pa.Table, after: pa.Table) -> np.ndarray:
    """Per aligned row pair: whether every value is equal (nulls equal nulls)."""
    same = np.ones(before.num_rows, dtype=bool)
    for name in before.column_names:
        x, y = before.column(name), after.column(name)
        try:
            eq = pc.equal(x, y)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            same &= False  # no comparison kernel (nested types): count it as changed
            continue
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= pc.fill_null(pc.or_kleene(eq, both_null), False).to_numpy(zero_copy_only=False)
    return same


def lookup_changes(table: Table, base: int | None, rows: pa.Table,
                   runs: Sequence[NewFile]) -> pa.Table:
    """The exact changes that committing ``runs`` on top of snapshot ``base`` makes (table
    columns + ``_row_kind`` codes), see the module docs."""
    rec = table._record
    key = list(rec.primary_key)
    units = {(f.partition_path, f.bucket) for f in runs}
    committed: list[FileTask] = []
    if base is not None:
        view = table._view(base, current_schema=True)
        live = table._metastore.live_files(rec.table_id, base,
                                           buckets=sorted({b for _, b in units if b is not None}))
        if live.num_rows:
            committed = file_tasks(view, live)
            paths = {pid: path for pid, path, _ in table._metastore.partitions(rec.table_id)}
            committed = [t for t in committed
                         if (paths.get(t.partition_id) if t.partition_id is not None else None,
                             t.bucket) in units]
    fresh = _new_tasks(table, runs, (base or 0) + 1)
    expr: Expr = AlwaysTrue()
    if len(key) == 1 and rows.num_rows:
        # Only the key range of the write: files outside it are pruned by their statistics.
        keys = rows.column(key[0])
        low, high = pc.min_max(keys).values()
        expr = and_all([col(key[0]) >= low.as_py(), col(key[0]) <= high.as_py()])
    touched = rows.select(key).group_by(key).aggregate([])
    before = _restrict(_merged(table, base, committed, expr), touched, key)
    spec = table._merge_spec()
    if spec is not None and spec.sequence_field is None:
        # Merging the current rows (one version per key) with the new runs equals merging
        # every version: what a compaction of the older runs into one relies on too. With a
        # sequence field it does not (kept tombstones order against sequence values), so
        # those tables read the merge of all runs again instead.
        written = _stored(table, base, fresh)
        written = written.append_column(SEQUENCE,
                                        pa.array(np.ones(written.num_rows, np.int64)))
        current = before.append_column(
            written.schema.field(ROW_KIND), pa.array(np.zeros(before.num_rows, np.int8))
        ).append_column(written.schema.field(SEQUENCE),
                        pa.array(np.zeros(before.num_rows, np.int64)))
        versions = pa.concat_tables([current.cast(written.schema), written])
        after = spec.engine.merge(versions, key, None, False,
                                  constant=spec.partition_by).select(before.column_names)
    else:
        after = _restrict(_merged(table, base, [*committed, *fresh], expr), touched, key)
    return diff(before, after, key)


def diff(before: pa.Table, after: pa.Table, key: Sequence[str]) -> pa.Table:
    """What turns ``before`` into ``after`` (both one merged row per key): ``-U``/``+U`` for
    changed rows, ``-D`` for keys gone, ``+I`` for new keys (table columns + ``_row_kind``)."""
    ib, ia = _pairs(before, after, key)
    gone = np.ones(before.num_rows, dtype=bool)
    gone[ib] = False
    new = np.ones(after.num_rows, dtype=bool)
    new[ia] = False
    b_pair, a_pair = before.take(pa.array(ib)), after.take(pa.array(ia))
    changed = ~_same(b_pair, a_pair)
    old_rows = b_pair.filter(pa.array(changed))
    new_rows = a_pair.filter(pa.array(changed))
    n = old_rows.num_rows
    # -U old, +U new, interleaved so each key's before-image directly precedes its new row.
    updates = pa.concat_tables([old_rows, new_rows.cast(old_rows.schema)])
    order = np.empty(2 * n, dtype=np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n, 2 * n)
    updates = updates.take(pa.array(order))
    kinds = np.empty(2 * n, dtype=np.int8)
    kinds[0::2] = int(RowKind.UPDATE_BEFORE)
    kinds[1::2] = int(RowKind.UPDATE_AFTER)
    out = [updates.append_column(ROW_KIND, pa.array(kinds))]
    for part, kind in ((before.filter(pa.array(gone)), RowKind.DELETE),
                       (after.filter(pa.array(new)).cast(before.schema), RowKind.INSERT)):
        out.append(part.append_column(
            ROW_KIND, pa.array(np.full(part.num_rows, int(kind), dtype=np.int8))))
    return pa.concat_tables(out)


def last_full_compaction(table: Table) -> int | None:
    """The snapshot of the table's last full compaction that wrote a changelog, if any."""
    snaps = table._metastore.snapshots(table._record.table_id)
    hits = snaps.filter(pc.match_substring(snaps.column("summary"),
                                           '"changelog": "full-compaction-diff"'))
    return None if hits.num_rows == 0 else int(hits.column("snapshot_id")[-1].as_py())


def full_compaction_changelog(table: Table, base: int) -> tuple[list[NewFile], dict[str, str]]:
    """For ``compact(full=True)`` of a ``full-compaction`` table: changelog files with the
    difference between the merged table at the last full compaction and at ``base``, and the
    summary entry marking this snapshot as the new reference."""
    key = list(table._record.primary_key)
    previous = last_full_compaction(table)
    after = table.scan(snapshot=base).to_arrow()
    before = table.scan(snapshot=previous).to_arrow().cast(after.schema) \
        if previous is not None else after.schema.empty_table()
    changes = diff(before, after, key)
    files = _write(table, changes) if changes.num_rows else []
    return files, {"changelog": "full-compaction-diff"}


def _restrict(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    if rows.num_rows == 0:
        return rows
    indexed = rows.select(list(key)).append_column(
        _INDEX, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hits = indexed.join(keys, keys=list(key), join_type="left semi").column(_INDEX)
    return rows.take(pa.array(np.sort(hits.to_numpy())))


# -- committing -------------------------------------------------------------------------------


class _StaleChangelog(CommitConflict):
    """A lookup changelog computed on a snapshot that a concurrent commit changed."""


def commit_runs(table: Table, kind: str, base: int | None, runs: list[NewFile],
                rows: pa.Table, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None) -> WriteResult:
    """Commit written runs with the changelog the table's producer asks for. ``on_rebase`` is
    the write's own conflict check; its CommitConflict reaches the caller unchanged."""
    producer = changelog_producer(table)
    if producer == "none":
        return commit_files(table, kind, base, runs, commit_id=commit_id, summary=summary,
                            on_rebase=on_rebase)
    if producer == "full-compaction":
        # Only full compactions write a changelog: streams skip this snapshot.
        return commit_files(table, kind, base, runs, commit_id=commit_id,
                            summary={**(summary or {}), "changelog": producer},
                            on_rebase=on_rebase)
    units = pa.array(sorted({f.bucket for f in runs if f.bucket is not None}), pa.int32())
    looked_up_at = base  # the snapshot the lookup read; the commit stays based on ``base``
    for attempt in range(10):
        if producer == "input":
            changes = rows
        else:
            changes = lookup_changes(table, looked_up_at, rows, runs)
        changelog = _write(table, changes) if changes.num_rows else []

        def stale(added: pa.Table, seen: int | None = looked_up_at) -> None:
            # The write's own check sees every commit since its base, on every attempt.
            if on_rebase is not None:
                on_rebase(added)
            # A commit after the snapshot the lookup read that touched these buckets makes the
            # changelog stale: it is computed again on top of it. Input changelogs never are.
            if producer != "lookup" or added.num_rows == 0:
                return
            newer = added if seen is None else added.filter(
                pc.greater(added.column("added_snapshot"), seen))
            if newer.num_rows and pc.any(pc.is_in(newer.column("bucket"), units)).as_py():
                raise _StaleChangelog("stale changelog")

        # Streams read only the changelog of a snapshot that says it has one (possibly empty:
        # a lookup that found no value changed), never its runs.
        noted = {**(summary or {}), "changelog": producer}
        change = SnapshotChange(kind=kind, schema_id=table._record.current_schema_id,
                                add=runs, commit_id=commit_id, summary=noted,
                                on_rebase=stale, changelog=changelog)
        try:
            result = table._metastore.commit(table._record.table_id, base, change)
        except _StaleChangelog:
            _discard(table, changelog)
            if attempt == 9:
                _discard(table, runs)
                raise
            looked_up_at = table.current_snapshot_id
            continue
        except BaseException:
            _discard(table, [*changelog, *runs])
            raise
        if result.duplicate:
            _discard(table, [*changelog, *runs])
            return WriteResult(result.snapshot_id, kind, attempts=result.attempts,
                               duplicate=True)
        return _result(kind, result, runs, 0, 0)
    raise AssertionError("unreachable")
