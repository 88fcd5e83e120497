"""Compaction of merge-on-write tables: for space and file count, never for read correctness.

Reads of a table with deletion vectors merge nothing, however many files a bucket holds; what
grows with writes is the bytes a read decodes and then drops (deleted rows) and the number of
files. Per partition and bucket, a compaction rewrites into one file the live rows of

- every file whose deleted fraction reaches ``deletion-vectors.rewrite-threshold`` (default
  0.3): it holds that much dead weight;
- the newest files the universal picking of :func:`~arrowlake.table.compaction.pick_runs`
  chooses by live bytes once the bucket holds more than ``compaction.max-runs`` files (each
  write adds one file per bucket it touches).

``compact(full=True)`` rewrites every bucket with more than one file or any deleted row. After a
write, the buckets it touched are compacted within ``compaction.write-budget`` times the bytes
it wrote (the first bucket due always), as for merge-on-read tables. The output keeps the
sequence range of its inputs. A compaction whose inputs another commit removed, or whose
vectors another commit extended meanwhile, is dropped: its output would bring those rows back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from arrowlake.errors import CommitConflict
from arrowlake.expressions import AlwaysTrue
from arrowlake.io.stats import decode_values
from arrowlake.io.writer import write_started
from arrowlake.merge.versions import sort_by_key
from arrowlake.metastore.records import NewFile, SnapshotChange
from arrowlake.scan.planning import TableView, file_tasks, make_splits
from arrowlake.scan.read import read_split_table
from arrowlake.scan.split import FileTask
from arrowlake.table.compaction import (
    CompactionResult,
    DueBucket,
    compaction_options,
    pick_runs,
)
from arrowlake.table.key_lookup import lookup_columns, remember_written
from arrowlake.table.pk_options import rewrite_threshold
from arrowlake.table.sorted_runs import start_group_writers
from arrowlake.table.writes import _discard

if TYPE_CHECKING:
    from arrowlake.table.table import Table

@dataclass(frozen=True)
class _Pick:
    files: list[FileTask]

    @property
    def live_bytes(self) -> int:
        return sum(_live_bytes(f) for f in self.files)


def _live_bytes(task: FileTask) -> int:
    if not task.row_count:
        return task.file_size
    return task.file_size * task.live_rows // task.row_count


def _groups(table: Table, base: int, buckets: Sequence[int] | None
            ) -> tuple[list[list[FileTask]], TableView]:
    view = table._view(base, current_schema=True)
    live = table._metastore.live_files(table._record.table_id, base,
                                       buckets=None if buckets is None else list(buckets))
    grouped: dict[tuple[str | None, int | None], list[FileTask]] = {}
    for task in file_tasks(view, live):
        grouped.setdefault((task.partition_values, task.bucket), []).append(task)
    # Oldest first, as the universal picking counts them.
    return [sorted(g, key=lambda f: (f.seq_max or 0, f.file_id)) for g in grouped.values()], view


def _pick(files: list[FileTask], props: Mapping[str, str], full: bool) -> list[FileTask]:
    if full:
        return files if len(files) > 1 or any(f.live_rows < f.row_count for f in files) else []
    threshold = rewrite_threshold(props)
    options = compaction_options(props)
    heavy = {f.file_id for f in files
             if f.row_count and (f.row_count - f.live_rows) >= threshold * f.row_count}
    newest = pick_runs([max(1, _live_bytes(f)) for f in files], options) \
        if len(files) > options.max_runs else 0
    chosen = {f.file_id for f in files[len(files) - newest:]} if newest else set()
    picked = [f for f in files if f.file_id in heavy | chosen]
    return picked if len(picked) > 1 or (picked and picked[0].file_id in heavy) else []


def compact_vectors(table: Table, *, full: bool = False, touched: Iterable[int] | None = None,
                    budget: int | None = None) -> CompactionResult:
    """Compact the buckets of a merge-on-write table (those numbered in ``touched`` only, when
    given), rewriting at most ``budget`` live bytes after the first bucket due."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return CompactionResult(None)
    props = table._record.properties
    groups, view = _groups(table, base, None if touched is None else sorted(set(touched)))
    picks = [_Pick(p) for p in (_pick(g, props, full) for g in groups) if p]
    # The most files first; a write's budget bounds what it pays for.
    picks.sort(key=lambda p: (-len(p.files), p.live_bytes))
    if budget is not None:
        kept: list[_Pick] = []
        for pick in picks:
            if not kept or pick.live_bytes <= budget:
                kept.append(pick)
                budget -= pick.live_bytes
        picks = kept
    if not picks:
        return CompactionResult(None)
    return _commit(table, view, base, picks)


def due_vector_buckets(table: Table) -> list[DueBucket]:
    """The buckets of the current snapshot with files past the rewrite threshold, or more
    than ``compaction.max-runs`` files: what :func:`compact_vectors` would rewrite, with the
    live bytes it would read. Most files first."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return []
    groups, _ = _groups(table, base, None)
    props = table._record.properties
    due = []
    for files in groups:
        picked = _pick(files, props, False)
        if picked:
            due.append(DueBucket(picked[0].partition_id, picked[0].bucket, len(files),
                                 _Pick(picked).live_bytes))
    return sorted(due, key=lambda d: (-d.runs, d.bytes))


def _commit(table: Table, view: TableView, base: int, picks: list[_Pick]) -> CompactionResult:
    rec = table._record
    schema = table.schema
    added: list[NewFile] = []
    try:
        for pick in picks:
            split = make_splits(view, pick.files, columns=schema.names, expr=AlwaysTrue(),
                                target_bytes=1 << 62)[0]
            rows = sort_by_key(read_split_table(split), list(rec.primary_key))
            group = (_partition_scalars(table, pick.files[0]), pick.files[0].bucket or 0, rows)
            files, started = write_started(partial(start_group_writers, table, [group], schema))
            # The next write in this process finds the new files' keys without reading them.
            remember_written(table._storage, rec.location, started, schema,
                             lookup_columns(rec.primary_key, rec.partition_by))
            # The output keeps the sequence range of the files it replaces.
            low = min(f.seq_min or 0 for f in pick.files)
            high = max(f.seq_max or 0 for f in pick.files)
            added += [replace(f, seq_min=low, seq_max=high) for f in files]
        removed = [f for pick in picks for f in pick.files]
        change = SnapshotChange(
            kind="compact", schema_id=rec.current_schema_id, add=added,
            remove=[f.file_id for f in removed],
            removed_rows=sum(f.live_rows for f in removed),
            summary={"buckets": len(picks)},
            expect_vectors={f.file_id: f.deletes.since if f.deletes else None for f in removed})
        try:
            result = table._metastore.commit(rec.table_id, base, change)
        except CommitConflict:
            _discard(table, added)
            return CompactionResult(None, dropped=True)
    except BaseException:
        _discard(table, added)
        raise
    return CompactionResult(result.snapshot_id, len(picks), len(removed), len(added),
                            removed_bytes=sum(f.file_size for f in removed),
                            added_bytes=sum(f.file_size for f in added))


def _partition_scalars(table: Table, task: FileTask) -> tuple[pa.Scalar, ...]:
    names = list(table._record.partition_by)
    if not names:
        return ()
    values = json.loads(task.partition_values or "[]")
    return tuple(decode_values([v], table.schema.field(n).type)[0]
                 for n, v in zip(names, values, strict=True))
