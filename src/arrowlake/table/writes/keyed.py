"""Primary-key tables: options, bucketing and the write path of upserts, deletes and changes.

Rows hash to buckets by key (:mod:`arrowlake.merge.bucketing`). Each commit writes, per touched
partition and bucket, one run: a Parquet file sorted by key with unique keys and an int8 row-kind
column. Versions of a key inside one write are resolved by the table's merge engine in input
order; versions across runs are merged when read (:mod:`arrowlake.merge.read`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.expressions import AlwaysTrue, Expr, referenced_columns
from arrowlake.io.stats import decode_values
from arrowlake.io.writer import (
    DataFileWriter,
)
from arrowlake.merge import (
    ROW_KIND,
    Aggregation,
    Deduplicate,
    FirstRow,
    PartialUpdate,
    RowKind,
)
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.runs import row_kinds_from
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import TableView, fully_matching, plan_files
from arrowlake.scan.scan import Scan
from arrowlake.table.changelogs import lookup as lookup_changelog
from arrowlake.table.changelogs.files import (
    REFERENCING_FORMAT,
    REFERENCING_SUMMARY,
    write_changelog,
)
from arrowlake.table.changelogs.lookup import LookupChangelog, lookup_files, rebase
from arrowlake.table.keys.runs import (
    start_runs,
    write_runs,
)
from arrowlake.table.options.primary_key import (
    DEFAULT_BUCKETS,
    changelog_producer,
    merge_engine,
    require_primary_key,
    sequence_field,
)
from arrowlake.table.writes.commit import commit_files, write_result
from arrowlake.table.writes.inputs import batch_stream
from arrowlake.table.writes.on_write import commit_with_changelog
from arrowlake.table.writes.plain import (
    WriteResult,
    conflict_on_new_matches,
    conformed,
)

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

_log = logging.getLogger(__name__)

def collect(table: TableState, data: Any, *, where: str = "input") -> pa.Table:
    """The whole input conformed to the table schema (a run must be sorted, so it is held)."""
    batches = list(conformed(data, table.schema, where=where))
    if not batches:
        return table.schema.empty_table()
    return pa.Table.from_batches(batches, schema=table.schema)


def with_kinds(rows: pa.Table, kinds: pa.Array | RowKind) -> pa.Table:
    if isinstance(kinds, RowKind):
        kinds = pa.array(np.full(rows.num_rows, int(kinds), dtype=np.int8))
    return rows.append_column(ROW_KIND, kinds)


def commit_rows(table: TableState, rows: pa.Table, kind: str, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None, base: int | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None) -> WriteResult:
    """Write ``rows`` (with ``_row_kind``) as runs and commit them on ``base`` (the current
    snapshot when None; with ``on_rebase``, None is the empty table the caller decided on),
    with the changelog the table's producer asks for. Compacting after it is the caller's
    (:mod:`arrowlake.table.maintenance.after_write`): a write inside a transaction does not.

    ``on_rebase`` is the commit's conflict check (see :func:`conflict_on_touched_keys`).
    """
    if table.record.deletion_vectors:
        check_sequence_values(table, rows)
        return commit_with_changelog(table, rows, kind, commit_id=commit_id,
                                     summary=summary, base=base, on_rebase=on_rebase)
    if base is None and on_rebase is None:
        # With ``on_rebase`` the caller decided on ``base``: None is the empty table, and the
        # commit must check everything committed since (the metastore rebases from None).
        table.refresh()
        base = table.current_snapshot_id
    if rows.num_rows == 0:
        return WriteResult(None, kind)
    check_sequence_values(table, rows)
    logged: lookup_changelog.LookupChangelog | None = None
    if changelog_producer(table) == "lookup":
        # The lookup reads the new runs' rows, not their files: it runs while they are written.
        writers: list[DataFileWriter] = []
        try:
            written = start_runs(table, rows, writers)
        except BaseException:
            for writer in writers:
                writer.abort()
            raise
        files, logged = lookup_changelog.finish_with_lookup(table, base, writers, written)
    else:
        files = write_runs(table, rows)
    result = commit_runs(table, kind, base, files, rows, commit_id=commit_id,
                         summary=summary, on_rebase=on_rebase, lookup_changelog=logged)
    return replace(result, written=tuple(files))


def check_sequence_values(table: TableState, rows: pa.Table) -> None:
    """Refuse NaN in a floating-point ``sequence_field``: it has no order against numbers.

    Nulls are accepted and order before every value (oldest); among equal sequence values
    the later commit, and within one write the later row, is newer.
    """
    seq = sequence_field(table)
    if seq is None or seq not in rows.column_names:
        return
    column = rows.column(seq)
    if not pa.types.is_floating(column.type):
        return
    # Tombstones carry the stored row's value: only versions being added are checked.
    adding = pc.is_in(rows.column(ROW_KIND), value_set=pa.array(
        [RowKind.INSERT, RowKind.UPDATE_AFTER], pa.int8()))
    nans = pc.sum(pc.and_(adding, pc.is_nan(column))).as_py() or 0
    if nans:
        raise ValidationError(
            f"{nans} rows have NaN in sequence_field '{seq}' of table '{table.name}'; NaN has "
            "no order against other values. Give a number, or null (null orders oldest)")


def check_deletes_supported(table: TableState, what: str) -> None:
    """Refuse a delete the table's merge engine would not carry out.

    ``first-row`` keeps the first version of a key forever, ``ignore-delete`` drops
    retractions, and ``aggregation`` subtracts a retraction unless
    ``aggregation.remove-record-on-delete`` is set: in all of them a ``-D`` does not remove
    the key, so ``delete()`` and ``when_matched_delete()`` would report rows as removed that
    stay. Change data (``write_changes``) keeps the engine's own retraction semantics.
    """
    engine = merge_engine(table)
    reason = None
    if isinstance(engine, FirstRow):
        reason = ("its merge engine is 'first-row', which keeps the first version of every key "
                  "and ignores retractions")
    elif isinstance(engine, (Deduplicate, PartialUpdate)) and engine.ignore_delete:
        reason = "it was created with ignore-delete, so retractions are dropped"
    elif isinstance(engine, Aggregation) and not engine.remove_record_on_delete:
        reason = ("its merge engine is 'aggregation', where a retraction only subtracts from "
                  "the aggregates; create the table with properties="
                  "{'aggregation.remove-record-on-delete': 'true'} to let deletes remove keys")
    if reason is not None:
        raise ValidationError(f"{what} cannot delete rows of table '{table.name}': {reason}")


def scan_at(table: TableState, base: int | None, expr: Any) -> pa.Table:
    """The merged rows matching ``expr`` at snapshot ``base``, in the current schema."""
    if base is None:
        return table.schema.empty_table()
    return Scan.create(table.view(base, current_schema=True), expr, None, None,
                       table.merge_spec()).to_arrow()


#: How often a delete or merge re-plans on a newer snapshot before giving up.
REPLAN_ATTEMPTS = 5


def gave_up(what: str, table: TableState, exc: CommitConflict) -> CommitConflict:
    return CommitConflict(
        f"{what} on table '{table.name}' was planned {REPLAN_ATTEMPTS} times and each time "
        f"another commit changed keys it read before it could commit ({exc}); the table is "
        "unchanged by it. Retry later, or serialize the writers of these keys")


def conflict_on_touched_keys(table: TableState, keys: pa.Table, base: int | None,
                             expr: Expr | None = None) -> Callable[[pa.Table], None]:
    """An ``on_rebase`` check for a write planned on the rows of ``keys`` at ``base`` (and,
    with ``expr``, on which rows matched it: a delete by filter).

    An overwrite committed after ``base`` conflicts (it may only have removed files). Files
    committed after ``base`` whose sequence range ends at or below it are compaction rewrites
    of older runs: they change no row. Any other one (a new run) in a bucket of the touched
    keys, whose key range may hold one of them (compared on the first key column, a superset of
    the composite range), may have changed what the write read: :class:`CommitConflict`.
    With ``expr``, so does a new run whose statistics say it may hold a row matching
    ``expr``: a key that matches only since ``base`` must be deleted too.
    Nothing is computed unless the commit has to be rebased.
    """
    rec = table.record
    key = list(rec.primary_key)
    first_type = table.schema.field(key[0]).type
    after = -1 if base is None else base
    keys = keys.select(key)
    new_matches = conflict_on_new_matches(table, expr) if expr is not None else None

    def first_values(texts: pa.ChunkedArray) -> pa.Array:
        return decode_values([None if t is None else json.loads(t)[0]
                              for t in texts.to_pylist()], first_type)

    def check(added: pa.Table) -> None:
        # The commits after ``base`` have all landed: this transaction holds the table.
        snaps = table.metastore.snapshots(rec.table_id).select(["snapshot_id", "kind"])
        later = snaps.filter(pc.greater(snaps.column("snapshot_id"), after))
        if pc.any(pc.equal(later.column("kind"), "overwrite")).as_py():
            raise CommitConflict(
                f"An overwrite committed after snapshot {base} on table '{table.name}' may have "
                "removed keys this write read; the table is unchanged")
        newer = pc.greater(pc.fill_null(added.column("seq_max"), np.iinfo(np.int64).max), after)
        new = added.filter(newer)
        if new.num_rows == 0:
            return
        if new_matches is not None:
            new_matches(new)
        # The touched keys' first column, grouped by bucket (one sort, then slices).
        buckets = bucket_of(keys, key, int(rec.buckets or DEFAULT_BUCKETS)).to_numpy()
        order = np.argsort(buckets, kind="stable")
        first = keys.column(key[0]).take(pa.array(order))
        sorted_buckets = buckets[order]
        lows, highs = first_values(new.column("key_min")), first_values(new.column("key_max"))
        # One step per new file (few: one per bucket a commit touched), vectorized over keys.
        for i, bucket in enumerate(new.column("bucket").to_pylist()):
            if bucket is None:
                values = first
            else:
                lo, hi = np.searchsorted(sorted_buckets, [bucket, bucket + 1])
                values = first.slice(int(lo), int(hi - lo))
            if len(values) == 0:
                continue
            inside = pa.array(np.ones(len(values), dtype=bool))
            if lows[i].is_valid:
                inside = pc.and_(inside, pc.greater_equal(values, lows[i]))
            if highs[i].is_valid:
                inside = pc.and_(inside, pc.less_equal(values, highs[i]))
            if pc.any(inside).as_py():
                raise CommitConflict(
                    f"A commit that landed after snapshot {base} wrote keys this write read "
                    f"on table '{table.name}'; the table is unchanged")

    return check


def upsert(table: TableState, data: Any, *, commit_id: str | None = None) -> WriteResult:
    require_primary_key(table, "upsert()")
    table.refresh()
    rows = collect(table, data)
    return commit_rows(table, with_kinds(rows, RowKind.INSERT), "upsert", commit_id=commit_id)


def write_changes(table: TableState, data: Any, row_kind: str = "op", *,
                  commit_id: str | None = None) -> WriteResult:
    """Write CDC rows: ``row_kind`` names the column holding ``+I -U +U -D`` (or 0-3)."""
    require_primary_key(table, "write_changes()")
    table.refresh()
    return commit_rows(table, change_rows(table, data, row_kind), "changes", commit_id=commit_id)


def change_rows(table: TableState, data: Any, row_kind: str = "op") -> pa.Table:
    """CDC rows conformed to the table schema, with their kinds as ``_row_kind`` codes."""

    schema, batches = batch_stream(data)
    if row_kind not in schema.names:
        raise ValidationError(
            f"The change data has no row-kind column '{row_kind}'; columns are "
            f"{', '.join(schema.names)}")
    kinds: list[pa.Array] = []

    def data_batches() -> Iterable[pa.RecordBatch]:
        for batch in batches:
            kinds.append(row_kinds_from(batch.column(row_kind)))
            yield batch.drop_columns([row_kind])

    # A reader (not a bare generator) keeps the schema known when the input has no rows.
    stripped = schema.remove(schema.get_field_index(row_kind))
    reader = pa.RecordBatchReader.from_batches(stripped, data_batches())
    rows = collect(table, reader, where="change data")
    codes = pa.concat_arrays(kinds) if kinds else pa.array([], pa.int8())
    return with_kinds(rows, codes)


def delete_keys(table: TableState, expr: Any, *, commit_id: str | None = None) -> WriteResult:
    """Write tombstones for every key whose current row matches ``expr`` (no rewrite).

    The keys are found on one snapshot; the commit fails inside its transaction if a run
    committed since may hold one of them (:func:`conflict_on_touched_keys`), and the delete is
    then planned again on the newer snapshot, up to :data:`REPLAN_ATTEMPTS` times.
    """

    check_deletes_supported(table, "delete()")
    for attempt in range(REPLAN_ATTEMPTS):
        table.refresh()
        base = table.current_snapshot_id
        matched = scan_at(table, base, expr)
        if matched.num_rows == 0:
            return WriteResult(None, "delete")
        tombstones = with_kinds(matched, RowKind.DELETE)
        try:
            result = commit_rows(table, tombstones, "delete", commit_id=commit_id,
                                 summary={"deleted_rows": matched.num_rows}, base=base,
                                 on_rebase=conflict_on_touched_keys(table, matched, base, expr))
        except CommitConflict as exc:
            if attempt == REPLAN_ATTEMPTS - 1:
                raise gave_up("delete()", table, exc) from exc
            continue
        return replace(result, removed_rows=matched.num_rows, added_rows=0)
    raise AssertionError("unreachable")


def overwrite(table: TableState, data: Any, expr: Any, *, commit_id: str | None = None
              ) -> WriteResult:
    """Replace the rows of whole partitions (or the whole table) of a primary-key table."""

    table.refresh()
    rec = table.record
    outside = referenced_columns(expr) - set(rec.partition_by)
    if outside:
        raise ValidationError(
            f"An overwrite of a primary-key table may only filter on partition columns "
            f"({', '.join(rec.partition_by) or 'none'}); the filter uses {sorted(outside)}. "
            "Use delete() and upsert() to replace individual keys.")
    check = None if isinstance(expr, AlwaysTrue) else expr
    batches = list(conformed(data, table.schema, check=check))
    rows = pa.Table.from_batches(batches, schema=table.schema) if batches else \
        table.schema.empty_table()
    files = write_runs(table, with_kinds(rows, RowKind.INSERT)) if rows.num_rows else []
    return commit_overwrite(table, files, expr, added_rows=rows.num_rows, commit_id=commit_id)


def _replaced_tombstones(table: TableState, view: TableView, expr: Any) -> list[int]:
    """The tombstone files of a merge-on-write table in the partitions an overwrite replaces:
    the deletes they remember are of rows the overwrite replaces too."""
    graves = table.metastore.live_files(view.record.table_id, view.snapshot_id,
                                         content="tombstone")
    if graves.num_rows and not isinstance(expr, AlwaysTrue):
        graves = graves.filter(fully_matching(view, graves, expr))
    return [int(i) for i in graves.column("file_id").to_pylist()]


def commit_overwrite(table: TableState, files: list[NewFile], expr: Any, *, added_rows: int,
                     commit_id: str | None = None,
                     tombstones: Sequence[NewFile] = ()) -> WriteResult:
    """Commit runs already written while removing the files of the partitions ``expr`` selects
    (every file when it is always true); the runs are deleted if the commit does not happen.
    ``tombstones``: tombstone files of the overwrite's deletes (deletion vectors with a
    sequence field), committed with it."""
    rec = table.record
    try:
        for attempt in range(5):
            table.refresh()
            base = table.current_snapshot_id
            view = table.view(base, current_schema=True)
            old = plan_files(view, expr)
            if old.num_rows and not isinstance(expr, AlwaysTrue):
                old = old.filter(fully_matching(view, old, expr))
            remove = old.column("file_id").to_pylist()
            graves = _replaced_tombstones(table, view, expr) if rec.deletion_vectors else []
            if not files and not remove and not graves and not tombstones:
                return WriteResult(None, "overwrite")
            removed_rows = int(pa.compute.sum(old.column("row_count")).as_py() or 0)
            if rec.deletion_vectors and remove:
                # Rows the removed files' vectors had deleted were no longer counted as live.
                removed_rows -= sum(v.cardinality for v in table.metastore.live_vectors(
                    rec.table_id, base, remove).values())
            change = SnapshotChange(
                kind="overwrite", schema_id=rec.current_schema_id, add=files, remove=remove,
                tombstones=list(tombstones), remove_tombstones=graves,
                removed_rows=removed_rows, deletion_vectors=rec.deletion_vectors,
                commit_id=commit_id, on_rebase=conflict_on_new_matches(table, expr))
            try:
                result = table.metastore.commit(rec.table_id, base, change)
            except CommitConflict:
                if attempt == 4:
                    raise
                continue
            return WriteResult(result.snapshot_id, "overwrite", len(files), len(remove),
                               added_rows, change.removed_rows,
                               result.attempts, result.duplicate)
    except BaseException:
        table.discard([*files, *tombstones])
        raise
    raise AssertionError("unreachable")


# -- committing -------------------------------------------------------------------------------


def commit_runs(table: TableState, kind: str, base: int | None, runs: list[NewFile],
                rows: pa.Table, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None,
                lookup_changelog: LookupChangelog | None = None) -> WriteResult:
    """Commit written runs with the changelog the table's producer asks for. ``on_rebase`` is
    the write's own conflict check; its CommitConflict reaches the caller unchanged.
    ``lookup_changelog``: a ``lookup`` table's changelog of ``runs`` on ``base``, already
    written (:func:`~arrowlake.table.changelogs.lookup.finish_with_lookup`); computed here when
    not given.

    A lookup changelog never makes the commit conflict. When commits landed after the snapshot
    it was computed on, the commit's transaction (which holds the table, so nothing else lands
    meanwhile) brings it up to date before recording it (:func:`rebase`): only the keys those
    commits also wrote are looked up again, so the work redone is bounded by what they wrote and
    contention can delay a write but never fail it."""
    producer = changelog_producer(table)
    if producer == "none":
        return commit_files(table, kind, base, runs, commit_id=commit_id, summary=summary,
                            on_rebase=on_rebase, deletion_vectors=False)
    if producer == "full-compaction":
        # Only full compactions write a changelog: streams skip this snapshot.
        return commit_files(table, kind, base, runs, commit_id=commit_id,
                            summary={**(summary or {}), "changelog": producer},
                            on_rebase=on_rebase, deletion_vectors=False)
    state: LookupChangelog | None = None
    try:
        if producer == "input":
            changelog = write_changelog(table, rows) if rows.num_rows else []
        else:
            state = lookup_changelog if lookup_changelog is not None \
                else lookup_files(table, base, runs)
            changelog = state.files
    except BaseException:
        table.discard(runs)  # the changelog's own files are deleted already
        raise
    # Streams read only the changelog of a snapshot that says it has one (possibly empty: a
    # lookup that found no value changed), never its runs.
    noted = {**(summary or {}), "changelog": producer}
    if state is not None and state.format2:
        noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT

    def rebased(added: pa.Table) -> None:
        # The write's own check sees every commit since its base.
        if on_rebase is not None:
            on_rebase(added)
        if state is not None and rebase(table, state, added):
            # The transaction records the change's changelog and summary after this check:
            # they are brought up to date in place.
            changelog[:] = state.files
            if state.format2:
                noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT
            else:
                noted.pop(REFERENCING_SUMMARY, None)

    change = SnapshotChange(kind=kind, schema_id=table.record.current_schema_id, add=runs,
                            commit_id=commit_id, summary=noted, on_rebase=rebased,
                            changelog=changelog, deletion_vectors=False)
    try:
        result = table.metastore.commit(table.record.table_id, base, change)
    except BaseException:
        table.discard([*(state.files if state is not None else changelog), *runs])
        raise
    if result.duplicate:
        table.discard([*changelog, *runs])
        return WriteResult(result.snapshot_id, kind, attempts=result.attempts, duplicate=True)
    return write_result(kind, result, runs, 0, 0)
