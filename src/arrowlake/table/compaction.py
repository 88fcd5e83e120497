"""Compaction of primary-key tables: merge a bucket's runs into one, so reads stop merging.

``compact(full=True)`` merges every run of each bucket that has more than one (or whose only
run still holds retractions). Without ``full`` a size-tiered policy picks, per bucket, the newest
runs whose sizes are alike (each older run at most ``compaction.size-ratio`` times the newer ones
together), or every run when a bucket has more than ``compaction.max-runs``. Only a contiguous
range of the newest runs is ever picked, so the output's sequence range never straddles a run
left out. A compaction that loses a race with another commit is dropped, never failed, and it
never changes the table's contents.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.expressions import AlwaysTrue
from arrowlake.io.writer import DataFileWriter, FileTarget, WriteOptions
from arrowlake.merge import ROW_KIND, SEQUENCE, Deduplicate, FirstRow
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD_ID, key_json, run_schema
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import file_tasks, make_splits
from arrowlake.scan.read import bucket_groups, merge_bucket
from arrowlake.scan.split import FileTask
from arrowlake.table import changelog
from arrowlake.table.writes import _discard

if TYPE_CHECKING:
    from arrowlake.table.table import Table


@dataclass(frozen=True)
class CompactionResult:
    snapshot_id: int | None  # None: nothing to do, or the compaction lost a race (dropped)
    buckets: int = 0
    removed_files: int = 0
    added_files: int = 0
    dropped: bool = False


@dataclass(frozen=True)
class CompactionOptions:
    """The parsed ``compaction.*`` properties of a table."""

    max_runs: int = 5
    size_ratio: float = 2.0


def compaction_options(props: Mapping[str, str]) -> CompactionOptions:
    """Parse and check the ``compaction.*`` properties (the one place that reads them).

    Called when a table is created, when its properties are set, and by compaction; raises
    :class:`ValidationError` naming a malformed property.
    """
    raw_runs = props.get("compaction.max-runs", "5")
    try:
        max_runs = int(str(raw_runs).strip())
    except ValueError:
        max_runs = 0
    if max_runs < 1:
        raise ValidationError(
            f"Property 'compaction.max-runs' must be a positive integer (runs per bucket before "
            f"a compaction merges them all), not {raw_runs!r}")
    raw_ratio = props.get("compaction.size-ratio", "2.0")
    try:
        ratio = float(str(raw_ratio).strip())
    except ValueError:
        ratio = float("nan")
    if not 0 < ratio < float("inf"):
        raise ValidationError(
            f"Property 'compaction.size-ratio' must be a finite number > 0 (how many times "
            f"larger an older run may be than the newer ones it joins), not {raw_ratio!r}")
    return CompactionOptions(max_runs, ratio)


def _has_retractions(task_stats: str) -> bool:
    stats = json.loads(task_stats)
    entry = stats.get(str(KIND_FIELD_ID))
    # Runs hold +I (0), +U (2), -D (3) and the internal restart (4), never -U: a maximum of 3
    # or more, or any doubt, means the run has rows a full compaction rewrites.
    return entry is None or entry[0] is None or entry[1] is None or entry[1] >= 3 or \
        entry[0] == 1


def _pick_tiered(runs: list[FileTask], max_runs: int, ratio: float) -> list[FileTask]:
    """Newest-first contiguous runs to merge (runs sorted oldest first)."""
    if len(runs) > max_runs:
        return runs
    picked: list[FileTask] = []
    size = 0
    for run in reversed(runs):
        if picked and run.file_size > ratio * size:
            break
        picked.append(run)
        size += run.file_size
    return list(reversed(picked)) if len(picked) > 1 else []


def compact(table: Table, full: bool = False,
            only: Iterable[tuple[int | None, int | None]] | None = None) -> CompactionResult:
    """Merge runs of buckets (all of them, or the ``(partition_id, bucket)`` pairs in ``only``)."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return CompactionResult(None)
    options = compaction_options(table._record.properties)
    max_runs, ratio = options.max_runs, options.size_ratio
    view = table._view(base, current_schema=True)
    files = table._metastore.live_files(table._record.table_id, base)
    stats_by_id = dict(zip(files.column("file_id").to_pylist(),
                           files.column("stats").to_pylist(), strict=True))
    tasks = file_tasks(view, files)
    wanted = set(only) if only is not None else None
    # Merging only newer runs must leave rows that combine with the runs left out as the
    # versions they replace would have. Newest (deduplicate) and oldest (first-row) always do.
    # Partial-update and aggregation do in commit order: a retraction followed by additions
    # becomes a RESTART row, a retraction last a -D row (or, for aggregation, an addition that
    # carries the subtraction). Ordered by a sequence field, a merged row would take one
    # sequence value for versions that older runs interleave with, so there a bucket is always
    # compacted whole.
    spec = table._merge_spec()
    assert spec is not None
    newer_runs_alone = isinstance(spec.engine, (Deduplicate, FirstRow)) or \
        spec.sequence_field is None
    plan: list[tuple[list[FileTask], bool]] = []  # (runs, includes the oldest run)
    for group in bucket_groups(tasks):
        if wanted is not None and (group[0].partition_id, group[0].bucket) not in wanted:
            continue
        runs = sorted(group, key=lambda f: (f.seq_max or 0, f.file_id))
        if full:
            # A lone run is rewritten only to drop its tombstones, which a table with a sequence
            # field keeps (see below).
            pick = runs if len(runs) > 1 or (
                spec.sequence_field is None and _has_retractions(stats_by_id[runs[0].file_id])
            ) else []
        else:
            pick = _pick_tiered(runs, max_runs, ratio)
            if pick and not newer_runs_alone:
                pick = runs
        if pick:
            plan.append((pick, pick[0] is runs[0]))
    log_files: list[NewFile] = []
    log_summary: dict[str, str] = {}
    if full and changelog.changelog_producer(table) == "full-compaction":
        log_files, log_summary = changelog.full_compaction_changelog(table, base)
    if not plan and not log_files:
        return CompactionResult(None)
    merge = table._merge_spec()
    columns = view.schema.names
    added: list[NewFile] = []
    try:
        for runs, includes_oldest in plan:
            split = make_splits(view, runs, columns=columns, expr=AlwaysTrue(),
                                target_bytes=1 << 62, merge=merge)[0]
            # Tombstones may go once nothing older is left to hide, except with a sequence
            # field: a version written later with a smaller sequence value must stay hidden.
            keep = not includes_oldest or spec.sequence_field is not None
            merged = merge_bucket(split, runs, columns, AlwaysTrue(), keep_retractions=keep)
            added += _write_compacted(table, merged, runs)
        change = SnapshotChange(
            kind="compact", schema_id=table._record.current_schema_id, add=added,
            remove=[f.file_id for runs, _ in plan for f in runs],
            removed_rows=sum(f.row_count for runs, _ in plan for f in runs),
            summary={"buckets": len(plan), **log_summary}, changelog=log_files)
        try:
            result = table._metastore.commit(table._record.table_id, base, change)
        except CommitConflict:
            # Another compaction (or a rewrite) took some of these runs first: drop this one.
            _discard(table, [*added, *log_files])
            return CompactionResult(None, dropped=True)
    except BaseException:
        _discard(table, [*added, *log_files])
        raise
    return CompactionResult(result.snapshot_id, len(plan), len(change.remove), len(added))


def _write_compacted(table: Table, merged: pa.Table, runs: list[FileTask]) -> list[NewFile]:
    """Write one bucket's merged rows as a run that keeps the inputs' sequence range."""
    rec = table._record
    schema = run_schema(table.schema)
    merged = merged.drop_columns([SEQUENCE]).rename_columns(
        [KIND_COLUMN if c == ROW_KIND else c for c in merged.column_names if c != SEQUENCE]
    ).select(schema.names)
    merged = pa.Table.from_arrays(merged.columns, schema=schema)
    seq_min = min(f.seq_min or 0 for f in runs)
    seq_max = max(f.seq_max or 0 for f in runs)
    sample = runs[0]
    rel = table._storage.relative(rec.location, sample.path)
    directory = rel.rsplit("/", 1)[0]
    part = _partition_of(table, sample.partition_id)
    key = list(rec.primary_key)
    target = FileTarget(table._storage, rec.location, schema, rec.current_schema_id,
                        WriteOptions.from_properties(rec.properties, sorted_runs=True))
    writer = DataFileWriter(
        target, directory, partition_path=part[0], partition_values=part[1],
        bucket=sample.bucket,
        file_hook=lambda t: {"key_min": key_json(t.slice(0, 1), key),
                             "key_max": key_json(t.slice(t.num_rows - 1, 1), key),
                             "seq_min": seq_min, "seq_max": seq_max})
    try:
        for batch in merged.to_batches():
            writer.write(batch)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def _partition_of(table: Table, partition_id: int | None) -> tuple[str | None, str | None]:
    if partition_id is None:
        return None, None
    for pid, path, values in table._metastore.partitions(table._record.table_id):
        if pid == partition_id:
            return path, values
    return None, None


def compact_if_needed(table: Table, touched: set[tuple[str | None, int | None]]) -> None:
    """After a commit: compact the touched buckets that now hold too many runs."""
    max_runs = compaction_options(table._record.properties).max_runs
    files = table._metastore.live_files(table._record.table_id, table.current_snapshot_id)
    if files.num_rows == 0:
        return
    paths = {path: pid for pid, path, _ in table._metastore.partitions(table._record.table_id)}
    wanted = {(paths.get(p) if p is not None else None, b) for p, b in touched}
    counts: dict[tuple[int | None, int | None], int] = {}
    for pid, bucket in zip(files.column("partition_id").to_pylist(),
                           files.column("bucket").to_pylist(), strict=True):
        counts[(pid, bucket)] = counts.get((pid, bucket), 0) + 1
    over = {k for k in wanted if counts.get(k, 0) > max_runs}
    if over:
        compact(table, full=False, only=over)
