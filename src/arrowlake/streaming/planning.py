"""Planning a stream's changes: which files (or positions) of a snapshot hold the rows it
changed, and the splits that read them with their row kinds, for every kind of table (append
tables by their added and removed files, primary-key tables by their runs or changelog files,
deletion-vector tables by their vectors) and for catch-up's net change over a range.

A :class:`ChangePlanner` holds what a stream reads (its table, filter, columns, shard); the
stream itself (:mod:`arrowlake.streaming.stream`) decides which snapshots to plan and when.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.expressions import (
    AlwaysTrue,
    Expr,
    and_all,
    conjuncts,
    may_match,
    parse_filter,
    referenced_columns,
    rename_columns,
)
from arrowlake.io.deletion_vectors import VectorRef, encode_positions
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD
from arrowlake.scan.planning import (
    TableView,
    file_schemas,
    file_stats,
    file_tasks,
    group_tasks,
    plan_files,
)
from arrowlake.scan.split import FileTask, MergeSpec, Split
from arrowlake.schema import field_id
from arrowlake.streaming.catchup import NetChangeSplit
from arrowlake.streaming.change import AnySplit, Change
from arrowlake.streaming.splits import ChangeSplit, ReferencedChangeSplit
from arrowlake.streaming.vector_changes import VectorChangeSplit
from arrowlake.table.changelogs.files import (
    AFTER_COLUMN,
    REFERENCING_SUMMARY,
    UNCHANGED,
    log_schema,
)
from arrowlake.table.changelogs.net_change import in_units, unit_ids
from arrowlake.table.table import Table

#: Splits of a change hold up to this many bytes of files.
_SPLIT_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    kind: str
    committed_at: int
    summary: dict[str, Any]
    files: int = 0  # files the snapshot added and removed, as its row records
    schema_id: int | None = None  # the table's schema when the snapshot was committed
    transaction_id: str | None = None  # the lake transaction it was committed in, if any



class ChangePlanner:
    """The changes one stream reads: of ``table``, the rows matching ``expr``, as ``columns``
    (with ``_row_kind`` when ``include_row_kind``), of the buckets ``keep_buckets`` keeps."""

    def __init__(self, table: Table, expr: Expr, columns: tuple[str, ...],
                 include_row_kind: bool, keep_buckets: Callable[[pa.Array], pa.Array] | None,
                 merge: MergeSpec | None, schema: pa.Schema) -> None:
        self._table = table
        self._metastore = table._metastore
        self._record = table._record
        self._table_id = table._record.table_id
        self._schema = table.schema
        self._expr = expr
        self._columns = columns
        self.include_row_kind = include_row_kind
        self._keep_buckets = keep_buckets
        self._merge = merge
        self.schema = schema  # what a change yields

    def view(self, snapshot_id: int | None) -> TableView:
        return TableView(self._metastore, self._table._storage, self._record, snapshot_id,
                         self._schema)

    def keep(self, files: pa.Table) -> pa.Table:
        """The files of this stream's shard: by bucket, or by file id on append tables."""
        if self._keep_buckets is None or files.num_rows == 0:
            return files
        by_bucket = self._merge is not None or self._record.deletion_vectors
        ids = files.column("bucket" if by_bucket else "file_id")
        return files.filter(pc.fill_null(self._keep_buckets(pc.cast(ids, pa.int64())), False))

    def prune(self, files: pa.Table) -> pa.Table:
        """Drop files whose statistics prove no row matches the filter (on key tables, only
        key conjuncts prune: a run's other columns say nothing about its retractions)."""
        expr = self._expr
        if self._merge is not None:
            keys = set(self._record.primary_key)
            expr = and_all([c for c in conjuncts(expr) if referenced_columns(c) <= keys])
        if isinstance(expr, AlwaysTrue) or files.num_rows == 0:
            return files
        cols = [c for c in sorted(referenced_columns(expr)) if c in self._schema.names]
        if not cols:
            return files
        stats = file_stats(files, self._schema, cols)
        return files.filter(pc.fill_null(may_match(expr, stats, self._schema), True))

    def splits(self, view: TableView, files: pa.Table, *, row_kind: str | None,
                merged: bool, expr: Expr | None = None) -> list[ChangeSplit]:
        """Change splits over ``files``: merged per bucket (``merged``), or read as written,
        with the row-kind column of primary-key runs when ``row_kind`` is None."""
        if files.num_rows == 0:
            return []
        tasks = file_tasks(view, files)
        schemas = file_schemas(view, tasks)
        schema = view.schema
        columns = self._columns
        merge = self._merge if merged else None
        if self._merge is not None or row_kind is None:
            # Runs and changelog files carry the row-kind column besides the table's.
            schemas = {sid: s.append(KIND_FIELD) for sid, s in schemas.items()}
        if row_kind is None:
            schema = schema.append(KIND_FIELD)
            columns = (*columns, KIND_COLUMN)
        if expr is None:
            expr = self._expr
        groups = group_tasks(tasks, whole_buckets=merge is not None, target_bytes=_SPLIT_BYTES)
        partition_by = tuple(self._record.partition_by)
        return [
            ChangeSplit(
                Split(view.storage, tuple(group),
                      {sid: schemas[sid] for sid in {t.schema_id for t in group}}, schema,
                      columns, expr, None, merge, partition_by=partition_by),
                row_kind, self.include_row_kind, self._columns)
            for group in groups
        ]

    def change(self, first: int, snap: Snapshot | None, snapshot_id: int, kind: str,
                committed_at: int, splits: Sequence[AnySplit]) -> Change:
        when = datetime.fromtimestamp(committed_at / 1000, UTC)
        return Change(snapshot_id, kind, when, tuple(splits), self.schema, first,
                      transaction_id=None if snap is None else snap.transaction_id)

    def full_change(self, snapshot_id: int, committed_at: int) -> Change:
        view = self.view(snapshot_id)
        files = self.keep(plan_files(view, self._expr))
        splits = self.splits(view, files, row_kind="+I", merged=self._merge is not None)
        return self.change(snapshot_id, None, snapshot_id, "full", committed_at, splits)

    def plan(self, snap: Snapshot, added: pa.Table, removed: pa.Table) -> Change | None:
        """The change of one snapshot that added and removed these files, or None when it
        changed no rows of the stream."""
        sid = snap.snapshot_id
        kept = self.keep(added)
        added, removed = self.prune(kept), self.prune(self.keep(removed))
        view = self.view(sid)
        splits: list[AnySplit] = []
        is_log = pc.equal(added.column("content"), "changelog")
        changelog, added = added.filter(is_log), added.filter(pc.invert(is_log))
        if self._merge is not None and snap.summary.get(REFERENCING_SUMMARY) is not None:
            # A lookup changelog that refers to the runs the snapshot added: read by bucket,
            # with all of its changelog files (pruned by the runs' key ranges).
            is_run = pc.equal(kept.column("content"), "data")
            splits += self._referencing_splits(view, kept.filter(pc.invert(is_run)),
                                               kept.filter(is_run))
        elif (self._merge is not None or self._record.deletion_vectors) and (
                changelog.num_rows or "changelog" in snap.summary):
            # The table's changelog producer wrote what this snapshot changed (with deletion
            # vectors: ``input`` and ``full-compaction``).
            splits += self.splits(view, changelog, row_kind=None, merged=False)
        elif self._record.properties.get("changelog-producer") == "full-compaction":
            # What streams of such a table hold changes only at full compactions (each with
            # its changelog, the net change since the previous one): a write without one,
            # an overwrite too, shows in the next.
            pass
        elif self._record.deletion_vectors:
            is_data = pc.equal(added.column("content"), "data")
            splits += self._vector_changes(snap, view, added.filter(is_data), removed)
        elif self._merge is not None:
            if removed.num_rows:
                # An overwrite of partitions: their rows as they were, retracted.
                splits += self.splits(self.view(sid - 1), removed, row_kind="-D",
                                       merged=True)
            splits += self.splits(view, added, row_kind=None, merged=False)
        else:
            splits += self._append_table_splits(snap, view, added, removed)
        if not splits:
            return None
        return self.change(sid, snap, sid, snap.kind, snap.committed_at, splits)

    def _vector_changes(self, snap: Snapshot, view: TableView, added: pa.Table,
                        removed: pa.Table) -> list[AnySplit]:
        """A merge-on-write snapshot's change: the rows at the positions it deleted and the
        rows of the files it added, paired by key, one split per partition and bucket."""
        sid = snap.snapshot_id
        ms, tid = self._metastore, self._table_id
        grown = ms.vectors_changed(tid, sid)
        before_view = self.view(sid - 1)
        touched = ms.live_files(tid, sid - 1, buckets=None) if grown else None
        gone: list[tuple[FileTask, VectorRef]] = []
        if touched is not None and touched.num_rows:
            touched = self.prune(self.keep(touched.filter(
                pc.is_in(touched.column("file_id"), pa.array(grown, pa.int64())))))
            tasks = file_tasks(before_view, touched)
            now = ms.live_vectors(tid, sid, [t.file_id for t in tasks])
            for task in tasks:
                new = now[task.file_id]
                ref = VectorRef(new.cardinality, new.blob, None if new.puffin_path is None
                                else view.storage.join(view.location, new.puffin_path),
                                new.blob_offset or 0, new.blob_length or 0, new.added_snapshot)
                positions = ref.positions(view.storage, task.path)
                if task.deletes is not None and task.deletes.cardinality:
                    positions = np.setdiff1d(
                        positions, task.deletes.positions(view.storage, task.path),
                        assume_unique=True)
                if len(positions):
                    gone.append((replace(task, deletes=None), VectorRef(
                        len(positions), encode_positions(positions)[0])))
        new_tasks = file_tasks(view, added)
        # Files an overwrite removed, with their vectors as of the snapshot before.
        dropped = file_tasks(before_view, removed) if removed.num_rows else []
        units: dict[tuple[str | None, int | None],
                    tuple[list[Any], list[FileTask], list[FileTask]]] = {}
        for task, ref in gone:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[0].append(
                (task, ref))
        for task in new_tasks:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[1].append(task)
        for task in dropped:
            units.setdefault((task.partition_values, task.bucket), ([], [], []))[2].append(task)
        everything = tuple(self._schema.names)
        out: list[AnySplit] = []
        for olds, news, gones in units.values():
            schemas = file_schemas(before_view, [t for t, _ in olds])
            after = self.split(view, news, merged=False, columns=everything,
                                expr=AlwaysTrue()) if news else None
            before = self.split(before_view, gones, merged=False, columns=everything,
                                 expr=AlwaysTrue()) if gones else None
            out.append(VectorChangeSplit(view.storage, tuple(olds), schemas, after, before,
                                         self._schema, tuple(self._record.primary_key),
                                         self._columns, self.include_row_kind, self._expr))
        return out

    def _referencing_splits(self, view: TableView, changelog: pa.Table, runs: pa.Table
                            ) -> list[AnySplit]:
        """One split per partition and bucket of a format-2 lookup changelog: the runs the
        snapshot added there (in key order, the order positions count in) and the changelog
        files there, if any. A key filter prunes whole buckets by their runs' key ranges: every
        row of a bucket's change carries the key of one of its runs' rows."""
        runs = self.prune(runs)
        if runs.num_rows == 0:
            return []
        key = self._record.primary_key
        log_tasks, run_tasks = file_tasks(view, changelog), file_tasks(view, runs)
        schemas = file_schemas(view, [*log_tasks, *run_tasks])
        needed = tuple(self._columns) + tuple(
            c for c in sorted(referenced_columns(self._expr)) if c not in self._columns)
        partition_by = tuple(self._record.partition_by)
        table = self._record.full_name
        logs: dict[tuple[int | None, int | None], list[FileTask]] = {}
        for task in log_tasks:
            logs.setdefault((task.partition_id, task.bucket), []).append(task)
        by_unit: dict[tuple[int | None, int | None], list[FileTask]] = {}
        for task in run_tasks:
            by_unit.setdefault((task.partition_id, task.bucket), []).append(task)
        out: list[AnySplit] = []
        for unit, tasks in by_unit.items():
            tasks.sort(key=lambda t: (t.key_range is None, t.key_range or (), t.file_id))
            run = Split(view.storage, tuple(tasks),
                        {t.schema_id: schemas[t.schema_id].append(KIND_FIELD) for t in tasks},
                        view.schema.append(KIND_FIELD), (*needed, KIND_COLUMN),
                        partition_by=partition_by, table=table)
            found = logs.get(unit)
            log = Split(view.storage, tuple(found),
                        {t.schema_id: log_schema(schemas[t.schema_id], key) for t in found},
                        log_schema(view.schema, key), (*needed, KIND_COLUMN, AFTER_COLUMN),
                        partition_by=partition_by, table=table) if found else None
            out.append(ReferencedChangeSplit(log, run, needed, AFTER_COLUMN, UNCHANGED,
                                             self._expr, self.include_row_kind,
                                             self._columns, view.schema))
        return out

    def _append_table_splits(self, snap: Snapshot, view: TableView, added: pa.Table,
                             removed: pa.Table) -> list[ChangeSplit]:
        """Append tables: added files as ``+I``. A delete or overwrite records its filter and
        the files it rewrote: the removed files' rows matching the filter are exactly the rows
        it removed (``-D``), the rewritten files only carry rows over and yield nothing."""
        splits: list[ChangeSplit] = []
        recorded = snap.summary.get("filter")
        carried = set(snap.summary.get("rewritten_paths", ()))
        if removed.num_rows:
            if recorded is not None:
                removed_by = self._in_current_names(
                    parse_filter(recorded), snap) if recorded else AlwaysTrue()
                expr = and_all([removed_by, self._expr])
            else:
                expr = self._expr
            splits += self.splits(self.view(snap.snapshot_id - 1), removed, row_kind="-D",
                                   merged=False, expr=expr)
        if carried and added.num_rows:
            new = pc.invert(pc.is_in(added.column("path"), pa.array(sorted(carried))))
            added = added.filter(new)
        splits += self.splits(view, added, row_kind="+I", merged=False)
        return splits

    def _in_current_names(self, expr: Expr, snap: Snapshot) -> Expr:
        """A filter recorded by ``snap`` in the column names of its time, in the names of the
        schema this stream reads (columns matched by field id: a later rename, or a new column
        taking an old name, does not change which rows it selects)."""
        if snap.schema_id is None:
            return expr
        then = self._metastore.schema(self._table_id, snap.schema_id)
        now = {field_id(f): f.name for f in self._schema}
        mapping: dict[str, str] = {}
        for name in referenced_columns(expr):
            top = name.split(".", 1)[0]
            if top not in then.names:
                continue
            current = now.get(field_id(then.field(top)))
            if current is None:
                raise ValidationError(
                    f"Snapshot {snap.snapshot_id} of table {self._table.name} deleted rows by "
                    f"column '{top}', which has been dropped since: its removed rows cannot be "
                    "told apart any more. Start the stream after that snapshot (start='latest' "
                    "or a later snapshot id)")
            mapping[name] = current + name[len(top):]
        return rename_columns(expr, mapping) if mapping else expr

    def net_change_splits(self, start: int, end: int, added: pa.Table) -> list[AnySplit]:
        if added.num_rows == 0:
            return []
        ms, tid = self._metastore, self._table_id
        touched_units = pc.unique(unit_ids(added))
        before_files = in_units(ms.live_files(tid, start), touched_units) if start > 0 \
            else None
        after_files = in_units(ms.live_files(tid, end), touched_units)
        views = {"after": self.view(end), "before": self.view(start)}
        groups: dict[int, dict[str, list[Any]]] = {}
        for name, files in (("after", after_files), ("before", before_files)):
            if files is None or files.num_rows == 0:
                continue
            units = unit_ids(files).to_pylist()
            for unit, task in zip(units, file_tasks(views[name], files), strict=True):
                groups.setdefault(unit, {}).setdefault(name, []).append(task)
        key = tuple(self._record.primary_key)
        everything = tuple(self._schema.names)
        packed: list[dict[str, list[Any]]] = []
        size = 0
        for unit in sorted(groups):
            parts = groups[unit]
            unit_size = sum(t.file_size for tasks in parts.values() for t in tasks)
            if not packed or size + unit_size > _SPLIT_BYTES:
                packed.append({})
                size = 0
            for name, tasks in parts.items():
                packed[-1].setdefault(name, []).extend(tasks)
            size += unit_size
        out: list[AnySplit] = []
        for parts in packed:
            before = self.split(views["before"], parts["before"], merged=True,
                                 columns=everything, expr=AlwaysTrue()) \
                if parts.get("before") else None
            after = self.split(views["after"], parts["after"], merged=True,
                                columns=everything, expr=AlwaysTrue()) \
                if parts.get("after") else None
            out.append(NetChangeSplit(before, after, key, self._columns,
                                      self.include_row_kind, self._expr))
        return out

    def split(self, view: TableView, tasks: Sequence[Any], *, merged: bool,
               columns: Sequence[str], expr: Expr) -> Split:
        schemas = file_schemas(view, tasks)
        if self._merge is not None:
            schemas = {sid: s.append(KIND_FIELD) for sid, s in schemas.items()}
        return Split(view.storage, tuple(tasks), schemas, view.schema, tuple(columns), expr,
                     None, self._merge if merged else None,
                     partition_by=tuple(self._record.partition_by))

    # -- prefetch ----------------------------------------------------------------------------
