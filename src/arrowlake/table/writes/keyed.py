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
from arrowlake.metastore.records import CommitResult
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
from arrowlake.table.writes.change import Change, Decide, Decision, commit
from arrowlake.table.writes.commit import write_result
from arrowlake.table.writes.inputs import batch_stream
from arrowlake.table.writes.on_write import OnWriteChange
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


def rows_change(table: TableState, kind: str, decide: Decide, *, decides: bool,
                commit_id: str | None = None) -> Change:
    """The change of a primary-key write whose rows ``decide`` gives for a snapshot (fixed
    rows unless ``decides``), in the table's mode: merged on write (deletion vectors) or
    written as runs merged on read. Compacting after it is the caller's
    (:mod:`arrowlake.table.maintenance.after_write`): a write inside a transaction does not."""
    if table.record.deletion_vectors:
        return OnWriteChange(table, kind, decide, decides=decides, commit_id=commit_id,
                             replan_attempts=REPLAN_ATTEMPTS)
    return RunsChange(table, kind, decide, decides=decides, commit_id=commit_id)


def fixed_rows(table: TableState, rows: pa.Table, kind: str, *, commit_id: str | None = None,
               summary: dict[str, Any] | None = None) -> Change:
    """The change of a write of ``rows`` (table schema + ``_row_kind``) that does not depend
    on the snapshot: an upsert, change data."""
    check_sequence_values(table, rows)
    decision = Decision(rows, dict(summary or {}))
    return rows_change(table, kind, lambda base: decision, decides=False, commit_id=commit_id)


def commit_rows(table: TableState, rows: pa.Table, kind: str, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None) -> WriteResult:
    """Write and commit ``rows`` (table schema + ``_row_kind``), with the changelog the
    table's producer asks for."""
    return commit(fixed_rows(table, rows, kind, commit_id=commit_id, summary=summary))


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


def upsert_change(table: TableState, data: Any, *, commit_id: str | None = None) -> Change:
    require_primary_key(table, "upsert()")
    table.refresh()
    rows = collect(table, data)
    return fixed_rows(table, with_kinds(rows, RowKind.INSERT), "upsert", commit_id=commit_id)


def upsert(table: TableState, data: Any, *, commit_id: str | None = None) -> WriteResult:
    return commit(upsert_change(table, data, commit_id=commit_id))


def changes_change(table: TableState, data: Any, row_kind: str = "op", *,
                   commit_id: str | None = None) -> Change:
    """CDC rows: ``row_kind`` names the column holding ``+I -U +U -D`` (or 0-3)."""
    require_primary_key(table, "write_changes()")
    table.refresh()
    return fixed_rows(table, change_rows(table, data, row_kind), "changes", commit_id=commit_id)


def write_changes(table: TableState, data: Any, row_kind: str = "op", *,
                  commit_id: str | None = None) -> WriteResult:
    """Write CDC rows: ``row_kind`` names the column holding ``+I -U +U -D`` (or 0-3)."""
    return commit(changes_change(table, data, row_kind, commit_id=commit_id))


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


def delete_change(table: TableState, expr: Any, *, commit_id: str | None = None) -> Change:
    """Tombstones for every key whose row matches ``expr`` on the snapshot planned on (no
    rewrite). The commit fails inside its transaction if a run committed since may hold one of
    them, or a row matching since (:func:`conflict_on_touched_keys`); the delete is then
    planned again on the newer snapshot, up to :data:`REPLAN_ATTEMPTS` times."""
    check_deletes_supported(table, "delete()")

    def decide(base: int | None) -> Decision | None:
        matched = scan_at(table, base, expr)
        if matched.num_rows == 0:
            return None
        return Decision(with_kinds(matched, RowKind.DELETE), {"deleted_rows": matched.num_rows},
                        conflict_on_touched_keys(table, matched, base, expr),
                        reported=(0, matched.num_rows))

    return rows_change(table, "delete", decide, decides=True, commit_id=commit_id)


def delete_keys(table: TableState, expr: Any, *, commit_id: str | None = None) -> WriteResult:
    """Write tombstones for every key whose current row matches ``expr`` (see
    :func:`delete_change`)."""
    return commit(delete_change(table, expr, commit_id=commit_id))


def overwrite_change(table: TableState, data: Any, expr: Any, *,
                     commit_id: str | None = None) -> Change:
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
    return OverwriteChange(table, files, expr, added_rows=rows.num_rows, commit_id=commit_id)


def overwrite(table: TableState, data: Any, expr: Any, *, commit_id: str | None = None
              ) -> WriteResult:
    """Replace the rows of whole partitions (or the whole table) of a primary-key table."""
    return commit(overwrite_change(table, data, expr, commit_id=commit_id))


def _replaced_tombstones(table: TableState, view: TableView, expr: Any) -> list[int]:
    """The tombstone files of a merge-on-write table in the partitions an overwrite replaces:
    the deletes they remember are of rows the overwrite replaces too."""
    graves = table.metastore.live_files(view.record.table_id, view.snapshot_id,
                                        content="tombstone")
    if graves.num_rows and not isinstance(expr, AlwaysTrue):
        graves = graves.filter(fully_matching(view, graves, expr))
    return [int(i) for i in graves.column("file_id").to_pylist()]


class OverwriteChange(Change):
    """Runs already written committed while the files of the partitions ``expr`` selects
    (every file when it is always true) are removed. ``tombstones``: tombstone files of the
    overwrite's deletes (deletion vectors with a sequence field), committed with it."""

    replans_on = (CommitConflict,)
    attempts = 5

    def __init__(self, table: TableState, files: Sequence[NewFile], expr: Any, *,
                 added_rows: int, commit_id: str | None = None,
                 tombstones: Sequence[NewFile] = ()) -> None:
        super().__init__(table, "overwrite", commit_id)
        self.files, self.expr, self.added_rows = list(files), expr, added_rows
        self.tombstones = list(tombstones)
        self.removed: list[int] = []
        self.removed_rows = 0

    def plan(self, base: int | None) -> SnapshotChange | None:
        table, expr = self.state, self.expr
        rec = table.record
        view = table.view(base, current_schema=True)
        old = plan_files(view, expr)
        if old.num_rows and not isinstance(expr, AlwaysTrue):
            old = old.filter(fully_matching(view, old, expr))
        self.removed = remove = old.column("file_id").to_pylist()
        graves = _replaced_tombstones(table, view, expr) if rec.deletion_vectors else []
        if not self.files and not remove and not graves and not self.tombstones:
            return None
        removed_rows = int(pc.sum(old.column("row_count")).as_py() or 0)
        if rec.deletion_vectors and remove:
            # Rows the removed files' vectors had deleted were no longer counted as live.
            removed_rows -= sum(v.cardinality for v in table.metastore.live_vectors(
                rec.table_id, base, remove).values())
        self.removed_rows = removed_rows
        return SnapshotChange(
            kind="overwrite", schema_id=rec.current_schema_id, add=self.files, remove=remove,
            tombstones=self.tombstones, remove_tombstones=graves,
            removed_rows=removed_rows, deletion_vectors=rec.deletion_vectors,
            commit_id=self.commit_id, on_rebase=conflict_on_new_matches(table, expr))

    def finish(self, commit: CommitResult) -> WriteResult:
        return WriteResult(commit.snapshot_id, "overwrite", len(self.files), len(self.removed),
                           self.added_rows, self.removed_rows, commit.attempts,
                           commit.duplicate)

    def discard(self) -> None:
        self.state.discard([*self.files, *self.tombstones])
        self.files, self.tombstones = [], []


# -- merge on read ------------------------------------------------------------------------------


class RunsChange(Change):
    """A write to a merge-on-read primary-key table: its rows as one sorted run per partition
    and bucket (or runs written already, by workers), committed with the changelog the table's
    producer asks for.

    A ``lookup`` changelog is computed on the snapshot planned on, while the runs are written;
    it never makes the commit conflict: when commits landed after that snapshot, the commit's
    transaction (which holds the table, so nothing else lands meanwhile) brings it up to date
    before recording it (:func:`rebase`), looking up again only the keys those commits also
    wrote. A write whose rows depend on the snapshot (``decides``: a delete, a merge) has its
    own check of what it read (``Decision.on_rebase``), and is planned again on the newer
    snapshot when that finds a conflict, up to :data:`REPLAN_ATTEMPTS` times.
    """

    def __init__(self, table: TableState, kind: str, decide: Decide | None, *,
                 decides: bool = False, runs: Sequence[NewFile] = (),
                 commit_id: str | None = None) -> None:
        super().__init__(table, kind, commit_id)
        self.decide = decide
        self.decides = decides
        self.replans_on = (CommitConflict,) if decides else ()
        self.attempts = REPLAN_ATTEMPTS if decides else 1
        self.prewritten = list(runs)
        self.runs: list[NewFile] = list(runs)
        self.changelog: list[NewFile] = []
        self.lookup: LookupChangelog | None = None
        self.decision: Decision | None = None

    def _forget_plan(self) -> None:
        table = self.state
        if not self.prewritten:
            table.discard(self.runs)
            self.runs = []
        table.discard(self.lookup.files if self.lookup is not None else self.changelog)
        self.changelog, self.lookup = [], None

    def plan(self, base: int | None) -> SnapshotChange | None:
        table = self.state
        self._forget_plan()
        if self.decide is not None:
            self.decision = self.decide(base)
            if self.decision is None:
                return None
        rows = self.decision.rows if self.decision is not None else None
        producer = changelog_producer(table)
        if not self.prewritten:
            if rows is None or rows.num_rows == 0:
                return None
            if producer == "lookup":
                # The lookup reads the new runs' rows, not their files: it runs while they
                # are written.
                writers: list[DataFileWriter] = []
                try:
                    written = start_runs(table, rows, writers)
                except BaseException:
                    for writer in writers:
                        writer.abort()
                    raise
                self.runs, self.lookup = lookup_changelog.finish_with_lookup(
                    table, base, writers, written)
            else:
                self.runs = write_runs(table, rows)
        summary = dict(self.decision.summary) if self.decision is not None else {}
        own = self.decision.on_rebase if self.decision is not None else None
        if producer in ("none", "full-compaction"):
            if producer == "full-compaction":
                summary["changelog"] = producer  # only full compactions write one
            return SnapshotChange(kind=self.kind, schema_id=table.record.current_schema_id,
                                  add=self.runs, commit_id=self.commit_id, summary=summary,
                                  on_rebase=own, deletion_vectors=False)
        if producer == "input":
            self.changelog = write_changelog(table, rows) \
                if rows is not None and rows.num_rows else []
        else:
            if self.lookup is None:
                self.lookup = lookup_files(table, base, self.runs)
            self.changelog = self.lookup.files
        return self._with_changelog(summary, producer, own)

    def _with_changelog(self, summary: dict[str, Any], producer: str,
                        own: Callable[[pa.Table], None] | None) -> SnapshotChange:
        table, state = self.state, self.lookup
        changelog = list(self.changelog)
        # Streams read only the changelog of a snapshot that says it has one (possibly empty: a
        # lookup that found no value changed), never its runs.
        noted = {**summary, "changelog": producer}
        if state is not None and state.format2:
            noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT

        def rebased(added: pa.Table) -> None:
            # The write's own check sees every commit since its base.
            if own is not None:
                own(added)
            if state is not None and rebase(table, state, added):
                # The transaction records the change's changelog and summary after this
                # check: they are brought up to date in place.
                changelog[:] = state.files
                if state.format2:
                    noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT
                else:
                    noted.pop(REFERENCING_SUMMARY, None)

        return SnapshotChange(kind=self.kind, schema_id=table.record.current_schema_id,
                              add=self.runs, commit_id=self.commit_id, summary=noted,
                              on_rebase=rebased, changelog=changelog, deletion_vectors=False)

    def gave_up(self, exc: CommitConflict) -> CommitConflict:
        return CommitConflict(
            f"{self.kind} on table '{self.state.name}' was planned {REPLAN_ATTEMPTS} times and "
            f"each time another commit changed keys it read before it could commit ({exc}); "
            "the table is unchanged by it. Retry later, or serialize the writers of these keys")

    def finish(self, commit: CommitResult) -> WriteResult:
        result = write_result(self.kind, commit, self.runs, 0, 0)
        reported = self.decision.reported if self.decision is not None else None
        if reported is not None:
            result = replace(result, added_rows=reported[0], removed_rows=reported[1])
        return replace(result, written=tuple(self.runs))

    def discard(self) -> None:
        self.prewritten = []  # the runs given are the change's to delete too
        self._forget_plan()
