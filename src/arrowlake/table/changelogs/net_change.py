"""The net change of a primary-key table between two snapshots, per key.

:func:`changed_files` finds, from the metastore alone, the partitions and buckets whose rows
may differ between two snapshots; a stream's catch-up reads those merged
(:mod:`arrowlake.streaming.catchup`), and :func:`net_change` reads those of a deletion-vector
table at both snapshots without any merge (files minus deleted positions), for its
``full-compaction`` changelog (:mod:`arrowlake.table.changelogs.vectors`). Both compare the two
states with :func:`~arrowlake.table.changelogs.files.diff`, vectorized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.expressions import AlwaysTrue
from arrowlake.scan.planning import file_tasks, make_splits
from arrowlake.scan.read import read_split_table
from arrowlake.table.changelogs.files import diff

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

#: Snapshot kinds that never change rows (a compaction rewrites them).
NO_CHANGE_KINDS = frozenset({"compact"})


def net_change(table: TableState, start: int | None, end: int) -> pa.Table:
    """What turns the rows of a deletion-vector table at ``start`` (None: no rows) into those
    at ``end`` (table columns + ``_row_kind``, see
    :func:`~arrowlake.table.changelogs.files.diff`), in the current schema."""
    ms, tid = table.metastore, table.record.table_id
    after = ms.live_files(tid, end)
    before = ms.live_files(tid, start) if start is not None else None
    if before is not None:
        units = pc.unique(unit_ids(changed_files(table, start or 0, end)))
        after, before = in_units(after, units), in_units(before, units)
    key = list(table.record.primary_key)
    return diff(_live_rows(table, start, before), _live_rows(table, end, after), key)


def _live_rows(table: TableState, snapshot: int | None, files: pa.Table | None) -> pa.Table:
    """The rows of ``files`` at ``snapshot`` (minus deleted positions), current schema."""
    schema = table.schema
    if snapshot is None or files is None or files.num_rows == 0:
        return schema.empty_table()
    view = table.view(snapshot, current_schema=True)
    splits = make_splits(view, file_tasks(view, files), columns=schema.names,
                         expr=AlwaysTrue(), target_bytes=1 << 62)
    return pa.concat_tables([read_split_table(s) for s in splits])


def changed_files(table: TableState, start: int, end: int,
                  snapshots: Sequence[dict[str, Any]] | None = None) -> pa.Table:
    """Data files (:data:`~arrowlake.metastore.store.FILE_SCHEMA`) whose partitions and
    buckets hold every row that may differ between snapshots ``start`` and ``end``: the files
    the snapshots in between added or removed, except compactions' (they move rows, changing
    none), and with deletion vectors the files whose vectors grew since ``start`` (a delete
    adds no file). ``snapshots``: those in ``(start, end]``, when already fetched."""
    ms, tid = table.metastore, table.record.table_id
    if snapshots is None:
        snapshots = ms.snapshots_after(tid, start, limit=max(end - start, 1), upto=end)
    added, removed = ms.files_changed(tid, start, end)
    added = added.filter(pc.equal(added.column("content"), "data"))
    skipped = pa.array([int(r["snapshot_id"]) for r in snapshots
                        if r["kind"] in NO_CHANGE_KINDS], pa.int64())
    if len(skipped):
        added = added.filter(pc.invert(pc.is_in(added.column("added_snapshot"), skipped)))
        removed = removed.filter(pc.invert(pc.is_in(removed.column("removed_snapshot"),
                                                    skipped)))
    files = pa.concat_tables([added, removed])
    if table.record.deletion_vectors:
        marked = ms.files_with_vectors_after(tid, start)
        files = pa.concat_tables([files, marked.cast(files.schema)])
    return files


def unit_ids(files: pa.Table) -> pa.Array:
    """Each file's (partition, bucket) as one integer (unpartitioned: a null partition)."""
    pid = pc.cast(pc.fill_null(files.column("partition_id"), -1), pa.int64())
    bucket = pc.cast(pc.fill_null(files.column("bucket"), 0), pa.int64())
    return pc.add(pc.multiply(pc.add(pid, 1), 1 << 32), bucket)


def in_units(files: pa.Table, units: pa.Array) -> pa.Table:
    """The files in the (partition, bucket) units ``units`` (of :func:`unit_ids`)."""
    if files.num_rows == 0:
        return files
    return files.filter(pc.is_in(unit_ids(files), units))
