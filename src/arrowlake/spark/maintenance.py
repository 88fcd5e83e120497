"""Maintenance as Spark jobs, for tables whose compaction or listing outgrows one machine.

- :func:`compact`: the driver picks what :meth:`arrowlake.Table.compact` would (the same
  functions decide); each picked bucket is one Spark task that reads its runs, merges them
  (merge-on-read tables) or drops their deleted rows (deletion-vector tables), writes the
  result and returns the written files' metadata; the driver commits them all as one
  snapshot, exactly as the in-process compaction does. A compaction that loses a race with
  another commit is dropped (its files deleted), never failed; on a deletion-vector table, so
  is one whose files a write marked rows of meanwhile (the in-process compaction catches up
  instead). If the job fails nothing is committed, and the files its tasks wrote are left to
  orphan removal.
- :func:`remove_orphan_files`: the table's directory tree is split on the driver into
  subtrees (one-level listings), the subtrees are listed by Spark tasks, the driver keeps the
  files no snapshot references (same rules as :meth:`arrowlake.Table.remove_orphan_files`),
  and tasks delete them in parallel.

Tasks receive what they need in their closure (the table's definition and storage, never the
metastore) and run through ``mapInArrow``, which Spark Connect sessions have too.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import SparkSession

from arrowlake.errors import CommitConflict
from arrowlake.expressions import AlwaysTrue
from arrowlake.io.storage import FileInfo, Storage
from arrowlake.io.writer import dictionary_columns, write_started
from arrowlake.lake import Lake
from arrowlake.merge.versions import sort_by_key
from arrowlake.metastore.records import NewFile, SnapshotChange
from arrowlake.scan.planning import make_splits
from arrowlake.scan.read import read_split_table
from arrowlake.scan.split import Split
from arrowlake.spark.source import LakeOptions, open_lake
from arrowlake.table.changelogs import vectors as vector_changelog
from arrowlake.table.keys.runs import start_group_writers
from arrowlake.table.maintenance import compaction, vector_compaction
from arrowlake.table.maintenance import housekeeping as maintenance
from arrowlake.table.maintenance.compaction import CompactionResult
from arrowlake.table.maintenance.housekeeping import OrphanResult
from arrowlake.table.options import primary_key as pk_options
from arrowlake.table.options.primary_key import changelog_producer
from arrowlake.table.staged import WriteTarget, write_target

if TYPE_CHECKING:
    from arrowlake.table.table import Table

#: Orphan removal splits the table's tree into about this many subtrees per core.
SUBTREES_PER_CORE = 4
#: Files one deleting task takes at most.
DELETE_BATCH = 10_000


def _open(lake: Lake | str, table: str, warehouse: str | None,
          storage_options: Mapping[str, Any] | None) -> Table:
    if isinstance(lake, str):
        lake = open_lake(LakeOptions.create(lake, warehouse, storage_options))
    return lake.table(table)


def _cores(spark: SparkSession) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.default.parallelism", "2") or 2))


def _task(work: Callable[[Any], Any], payloads: Sequence[bytes],
          batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task: the payloads whose indexes it is given, each done by ``work``; the
    results go back pickled."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            result = work(pickle.loads(payloads[index]))
            yield pa.record_batch({"index": pa.array([index], pa.int64()),
                                   "result": pa.array([pickle.dumps(result)], pa.binary())})


def run_tasks(spark: SparkSession, work: Callable[[Any], Any], payloads: Sequence[Any]
              ) -> list[Any]:
    """``work(payload)`` for each payload, one Spark task each; the results in order."""
    if not payloads:
        return []
    # The payloads travel in the function's closure: in the stage's task binary, which Spark
    # broadcasts (once per executor), each task taking its own by index.
    blobs = [pickle.dumps(p) for p in payloads]
    df = spark.range(len(blobs), numPartitions=len(blobs)).mapInArrow(
        partial(_task, work, blobs), "index long, result binary")
    out = df.toArrow()
    results: list[Any] = [None] * len(blobs)
    for index, blob in zip(out.column("index").to_pylist(), out.column("result").to_pylist(),
                           strict=True):
        results[index] = pickle.loads(blob)
    return results


# -- compaction -----------------------------------------------------------------------------------


def compact(spark: SparkSession, lake: Lake | str, table: str, full: bool = False, *,
            warehouse: str | None = None,
            storage_options: Mapping[str, Any] | None = None) -> CompactionResult:
    """:meth:`arrowlake.Table.compact` as a Spark job: each picked bucket merged (or, with
    deletion vectors, rewritten) by a task, all committed at once by the driver."""
    t = _open(lake, table, warehouse, storage_options)
    t._check_write()
    pk_options.require_primary_key(t.state, "compact()")
    if t._record.deletion_vectors:
        return _compact_vectors(spark, t, full)
    target = write_target(t.state, "spark-compact")
    with target.writing():  # a full-compaction changelog is written while planning
        planned = compaction.plan_compaction(t.state, full)
    if planned is None:
        return CompactionResult(None)
    plan, picks, log = planned
    if not picks and not log[0]:
        return CompactionResult(None)
    merge = t._merge_spec()
    assert merge is not None
    partitions = {pid: (path, values) for pid, path, values in
                  t._metastore.partitions(t._record.table_id)}
    inputs = [[f for run in runs for f in run] for runs, _ in picks]
    payloads = [(target, compaction.pick_split(plan, merge, files),
                 compaction.keeps_retractions(plan, whole),
                 {files[0].partition_id: partitions[files[0].partition_id]}
                 if files[0].partition_id in partitions else {})
                for files, (_, whole) in zip(inputs, picks, strict=True)]
    added: list[NewFile] = []
    try:
        added = [f for files in run_tasks(spark, _merge_bucket, payloads) for f in files]
        with target.writing():  # the commit checks the registration the tasks wrote under
            return compaction.commit_merged(t.state, plan.base, inputs, added, log)
    except BaseException:
        t.state.discard([*added, *log[0]])
        raise


def _merge_bucket(payload: tuple[WriteTarget, Split, bool, dict[int, tuple[str, str]]]
                  ) -> list[NewFile]:
    """A task: one bucket's picked runs merged and written as one run."""
    target, split, keep, partitions = payload
    files = list(split.files)
    with target.writing():  # the files belong to the driver's registered write
        merged = compaction.merge_pick(target, split, keep_retractions=keep)
        written, _ = write_started(lambda writers: writers.append(compaction._write_compacted(
            target, merged, files, partitions, dictionary_columns(merged))))
    return written


def _compact_vectors(spark: SparkSession, t: Table, full: bool) -> CompactionResult:
    """A deletion-vector table's compaction: the picks of
    :func:`~arrowlake.table.maintenance.vector_compaction.compact_vectors` rewritten by
    tasks. A full one of a ``full-compaction`` table commits its changelog too (computed by
    the driver once the tasks are done), and is dropped if any commit lands while the job
    runs."""
    t.refresh()
    base = t.current_snapshot_id
    if base is None:
        return CompactionResult(None)
    props = t._record.properties
    groups, view = vector_compaction._groups(t.state, base, None)
    picks = [p for p in (vector_compaction._pick(g, props, full) for g in groups) if p]
    logged = full and changelog_producer(t.state) == "full-compaction"
    if not picks and not logged:
        return CompactionResult(None)
    picks.sort(key=lambda p: (-len(p), vector_compaction._Pick(p).live_bytes))
    target = write_target(t.state, "spark-compact")
    added: list[NewFile] = []
    log: list[NewFile] = []
    try:
        splits = [make_splits(view, files, columns=target.schema.names, expr=AlwaysTrue(),
                              target_bytes=1 << 62)[0] for files in picks]
        added = [f for files in run_tasks(spark, _rewrite_bucket,
                                          [(target, split) for split in splits])
                 for f in files]
        removed = [f for files in picks for f in files]
        summary: dict[str, Any] = {"buckets": len(picks)}
        if logged:
            with target.writing():
                log, noted = vector_changelog.full_compaction_changelog(t.state, base)
            summary.update(noted)
            if not picks and not log:
                return CompactionResult(None)  # nothing changed since the last one
        change = SnapshotChange(
            kind="compact", schema_id=t._record.current_schema_id, add=added,
            remove=[f.file_id for f in removed],
            removed_rows=sum(f.live_rows for f in removed), summary=summary, changelog=log,
            on_rebase=vector_changelog.refuse_rebase(base) if logged else None,
            expect_vectors={f.file_id: f.deletes.since if f.deletes else None
                            for f in removed}, deletion_vectors=True)
        try:
            with target.writing():  # the commit checks the registration the tasks wrote under
                result = t._metastore.commit(t._record.table_id, base, change)
        except CommitConflict:
            t.state.discard([*added, *log])
            return CompactionResult(None, dropped=True)
    except BaseException:
        t.state.discard([*added, *log])
        raise
    return CompactionResult(result.snapshot_id, len(picks), len(removed), len(added),
                            removed_bytes=sum(f.file_size for f in removed),
                            added_bytes=sum(f.file_size for f in added))


def _rewrite_bucket(payload: tuple[WriteTarget, Split]) -> list[NewFile]:
    """A task: the live rows of one bucket's picked files (those ``split`` reads), written as
    one file that keeps their sequence range."""
    target, split = payload
    files = list(split.files)
    rows = sort_by_key(read_split_table(split), list(target.record.primary_key))
    group = (vector_compaction._partition_scalars(target, files[0]), files[0].bucket or 0,
             rows)
    with target.writing():  # the files belong to the driver's registered write
        written, _ = write_started(partial(start_group_writers, target, [group], target.schema))
    low = min(f.seq_min or 0 for f in files)
    high = max(f.seq_max or 0 for f in files)
    return [replace(f, seq_min=low, seq_max=high) for f in written]


# -- orphan files ---------------------------------------------------------------------------------


def remove_orphan_files(spark: SparkSession, lake: Lake | str, table: str,
                        older_than: timedelta = timedelta(days=1), dry_run: bool = True, *,
                        warehouse: str | None = None,
                        storage_options: Mapping[str, Any] | None = None) -> OrphanResult:
    """:meth:`arrowlake.Table.remove_orphan_files` as a Spark job: the table's files listed
    and the orphans deleted by tasks."""
    maintenance.check_older_than(older_than)
    t = _open(lake, table, warehouse, storage_options)
    t.refresh()
    storage = t._storage
    location = t._record.location
    cores = _cores(spark)
    # List before reading references (see arrowlake.table.maintenance.housekeeping.orphans_of).
    files, subtrees = _subtrees(storage, location, SUBTREES_PER_CORE * cores)
    groups = [subtrees[i::SUBTREES_PER_CORE * cores]
              for i in range(min(len(subtrees), SUBTREES_PER_CORE * cores))]
    for listed in run_tasks(spark, _list, [(storage, g) for g in groups]):
        files.extend(listed)
    own = maintenance.keep_own(files, location, t._metastore, t._record.table_id)
    orphans = maintenance.orphans_of(t.state, own, older_than)
    paths = sorted(f.path for f in orphans)
    if not dry_run and paths:
        batches = max(min(cores, len(paths)), -(-len(paths) // DELETE_BATCH))
        run_tasks(spark, _delete, [(storage, paths[i::batches]) for i in range(batches)])
    return OrphanResult(paths, sum(f.size for f in orphans), dry_run)


def _subtrees(storage: Storage, location: str, wanted: int) -> tuple[list[FileInfo], list[str]]:
    """The files above the subtrees, and the subtrees: the tree is opened level by level
    (at most four) until it has ``wanted`` subtrees or none is left to open."""
    files: list[FileInfo] = []
    level = [location]
    for _ in range(4):
        deeper: list[str] = []
        for directory in level:
            found, children = storage.list_children(directory)
            files.extend(found)
            deeper.extend(children)
        level = deeper
        if not level or len(level) >= wanted:
            break
    return files, level


def _list(payload: tuple[Storage, list[str]]) -> list[FileInfo]:
    storage, prefixes = payload
    return [f for prefix in prefixes for f in storage.list_files(prefix)]


def _delete(payload: tuple[Storage, list[str]]) -> int:
    storage, paths = payload
    storage.delete(paths)
    return len(paths)
