"""Compaction of primary-key tables: merge a bucket's runs into one, so reads stop merging.

A bucket's runs are its files grouped by sequence range (a compaction's output may span several
files; they share one range), oldest first. ``compact(full=True)`` merges every run of each
bucket that has more than one (or whose only run still holds retractions). Otherwise runs are
picked as in Paimon's universal compaction (:func:`pick_runs`), per bucket, always a contiguous
range of the newest runs, so the output's sequence range never straddles a run left out:

- size amplification: when the runs newer than the oldest hold more than
  ``compaction.max-size-amplification-percent`` (default 200) of the oldest run's bytes, the
  whole bucket is merged;
- size ratio: otherwise, starting from the newest run, older runs are added while each is at
  most ``compaction.size-ratio`` (default 1.0) times the runs picked so far together; a bucket
  over ``compaction.max-runs`` (default 10) starts with enough of its newest runs to get back to
  that many. The oldest run never joins by size ratio: it usually holds most of the bucket, and
  rewriting it is what size amplification alone decides (with ``compaction.max-runs`` 1 it joins
  whenever there is a newer run).

Unlike Paimon, where the size ratio may also reach the oldest run, a bucket whose newer runs
add up to about its oldest one is not rewritten whole: with a size ratio of 1 that would happen
at 100% amplification, long before the limit of 200%, and the limit would never decide.

A commit compacts the buckets it touched that hold more than ``compaction.max-runs`` runs
(:func:`compact_if_needed`), within a budget of ``compaction.write-budget`` (default 5) times the
bytes it wrote, so that no single write pays for rewriting the whole table: buckets with the most
runs go first; one whose whole-bucket merge does not fit merges only its newer runs if that fits,
else waits for a later write. The first bucket due is always compacted, budget or not.

A compaction that loses a race with another commit is dropped, never failed, and it never
changes the table's contents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from arrowlake.errors import CommitConflict
from arrowlake.expressions import AlwaysTrue
from arrowlake.io.pools import ContextPool
from arrowlake.io.writer import (
    DataFileWriter,
    FileTarget,
    WriteOptions,
    close_all,
    dictionary_columns,
)
from arrowlake.merge import ROW_KIND, SEQUENCE, Deduplicate, FirstRow
from arrowlake.merge.read import MergeSpec
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD_ID, key_json, run_schema
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import TableView, file_tasks, make_splits
from arrowlake.scan.read import (
    bucket_groups,
    constant_column,
    fillable,
    merge_bucket,
    partition_scalars,
)
from arrowlake.scan.split import FileTask, Split
from arrowlake.table.changelogs import producers as changelog
from arrowlake.table.keys.run_cache import held_runs, remember_runs
from arrowlake.table.options.compaction import CompactionOptions, compaction_options
from arrowlake.table.options.primary_key import changelog_producer
from arrowlake.table.writes.commit import CompactionResult

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


# -- picking runs ---------------------------------------------------------------------------------


def pick_runs(sizes: Sequence[int], options: CompactionOptions, *,
              keep_oldest: bool = False) -> int:
    """How many of the newest runs to merge (0: none), for runs of ``sizes`` bytes, oldest
    first. With ``keep_oldest`` the oldest run is left out (and with it size amplification)."""
    n = len(sizes)
    if n < 2:
        return 0
    if not keep_oldest and (
            sum(sizes[1:]) * 100 > options.max_size_amplification_percent * sizes[0]
            or n > options.max_runs == 1):
        # The oldest run joins only here: for size amplification, or when even one merge of
        # all the newer runs would leave more than max-runs.
        return n
    limit = n - 1
    # Over max-runs: start with enough newest runs that merging them leaves max-runs.
    count = min(max(1, n - options.max_runs + 1), limit)
    size = sum(sizes[n - count:])
    while count < limit and sizes[n - count - 1] <= size * options.size_ratio:
        size += sizes[n - count - 1]
        count += 1
    return count if count >= 2 else 0


# -- compacting -----------------------------------------------------------------------------------


Run = list[FileTask]  # one run of a bucket: the files of one sequence range


def _has_retractions(task_stats: str) -> bool:
    stats = json.loads(task_stats)
    entry = stats.get(str(KIND_FIELD_ID))
    # Runs hold +I (0), +U (2), -D (3) and the internal restart (4), never -U: a maximum of 3
    # or more, or any doubt, means the run has rows a full compaction rewrites.
    return entry is None or entry[0] is None or entry[1] is None or entry[1] >= 3 or \
        entry[0] == 1


def _runs_of(group: list[FileTask]) -> list[Run]:
    """A bucket's files as runs, oldest first. A run's files share one sequence range (one
    commit, or one compaction's output), and live runs' ranges never overlap."""
    runs: dict[tuple[int, int, int], Run] = {}
    for f in group:
        # A file without a sequence range (never written so) is a run of its own.
        known = f.seq_min is not None and f.seq_max is not None
        key = (f.seq_max or 0, f.seq_min or 0, -1 if known else f.file_id)
        runs.setdefault(key, []).append(f)
    return [runs[k] for k in sorted(runs)]


def _size(run: Run) -> int:
    return sum(f.file_size for f in run)


@dataclass
class _Plan:
    """A snapshot's buckets as runs, and what compacting them needs to know."""

    base: int
    buckets: dict[tuple[int | None, int | None], list[Run]]
    stats: dict[int, str]
    view: TableView
    # Merging only newer runs must leave rows that combine with the runs left out as the
    # versions they replace would have. Newest (deduplicate) and oldest (first-row) always do.
    # Partial-update and aggregation do in commit order: a retraction followed by additions
    # becomes a RESTART row, a retraction last a -D row (or, for aggregation, an addition that
    # carries the subtraction). Ordered by a sequence field, a merged row would take one
    # sequence value for versions that older runs interleave with, so there a bucket is always
    # compacted whole.
    newer_runs_alone: bool
    sequence_field: bool


def _load(table: TableState, base: int, files: pa.Table | None = None) -> _Plan:
    view = table.view(base, current_schema=True)
    if files is None:
        files = table.metastore.live_files(table.record.table_id, base)
    stats = dict(zip(files.column("file_id").to_pylist(), files.column("stats").to_pylist(),
                     strict=True))
    tasks = file_tasks(view, files)
    buckets = {(g[0].partition_id, g[0].bucket): _runs_of(g) for g in bucket_groups(tasks)}
    spec = table.merge_spec()
    assert spec is not None
    return _Plan(base, buckets, stats, view,
                 isinstance(spec.engine, (Deduplicate, FirstRow)) or spec.sequence_field is None,
                 spec.sequence_field is not None)


def _count(plan: _Plan, runs: list[Run], options: CompactionOptions) -> int:
    count = pick_runs([_size(r) for r in runs], options)
    return len(runs) if count and not plan.newer_runs_alone else count


def compact(table: TableState, full: bool = False,
            only: Iterable[tuple[int | None, int | None]] | None = None) -> CompactionResult:
    """Merge runs of buckets (all of them, or the ``(partition_id, bucket)`` pairs in ``only``)."""
    planned = plan_compaction(table, full, only)
    if planned is None:
        return CompactionResult(None)
    return _commit(table, *planned)


Pick = tuple[list[Run], bool]  # the runs to merge, and whether they are all the bucket's runs
ChangelogFiles = tuple[list[NewFile], dict[str, str]]  # a full compaction's changelog


def plan_compaction(table: TableState, full: bool = False,
                    only: Iterable[tuple[int | None, int | None]] | None = None
                    ) -> tuple[_Plan, list[Pick], ChangelogFiles] | None:
    """What :func:`compact` merges: the plan, the picks, and the changelog files (already
    written: the caller commits or discards them) of a full-compaction table. None when the
    table has no snapshot."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return None
    options = compaction_options(table.record.properties)
    plan = _load(table, base)
    wanted = set(only) if only is not None else None
    picks: list[Pick] = []
    for key, runs in plan.buckets.items():
        if wanted is not None and key not in wanted:
            continue
        if full:
            # A lone run is rewritten only to drop its tombstones, which a table with a sequence
            # field keeps (see below).
            count = len(runs) if len(runs) > 1 or (not plan.sequence_field and any(
                _has_retractions(plan.stats[f.file_id]) for f in runs[0])) else 0
        else:
            count = _count(plan, runs, options)
        if count:
            picks.append((runs[len(runs) - count:], count == len(runs)))
    log: ChangelogFiles = ([], {})
    if full and changelog_producer(table) == "full-compaction":
        # The difference from the previous full compaction, committed with this one.
        log = changelog.full_compaction_changelog(table, base)
    return plan, picks, log


def compact_if_needed(table: TableState, written: Sequence[NewFile]) -> CompactionResult | None:
    """After a commit of the runs ``written``: compact the buckets it touched that now hold more
    than ``compaction.max-runs`` runs, within the write's budget (see the module doc). None when
    no bucket was due."""
    options = compaction_options(table.record.properties)
    base = table.current_snapshot_id
    if base is None:
        return None
    known = table.metastore.partition_ids(table.record.table_id)
    touched = {(known.get(f.partition_path, f.partition_values), f.bucket) for f in written}
    # Count the touched buckets' runs before planning anything: most commits find none due.
    files = table.metastore.live_files(
        table.record.table_id, base,
        partition_ids=None if None in {p for p, _ in touched} else sorted(
            {p for p, _ in touched if p is not None}),
        buckets=sorted({b for _, b in touched if b is not None}))
    runs_in: dict[tuple[int | None, int | None], set[tuple[int | None, ...]]] = {}
    for pid, bucket, lo, hi, fid in zip(*(files.column(c).to_pylist() for c in (
            "partition_id", "bucket", "seq_min", "seq_max", "file_id")), strict=True):
        runs_in.setdefault((pid, bucket), set()).add(
            (lo, hi) if lo is not None and hi is not None else (fid,))
    if not any(len(runs_in.get(key, ())) > options.max_runs for key in touched):
        return None
    plan = _load(table, base, files)
    due = [runs for key, runs in plan.buckets.items()
           if key in touched and len(runs) > options.max_runs]
    if not due:
        return None
    # Buckets with the most runs first; among equals, the cheapest first.
    choices = []
    for runs in due:
        count = _count(plan, runs, options)
        cheaper = pick_runs([_size(r) for r in runs], options, keep_oldest=True) \
            if count == len(runs) and plan.newer_runs_alone else 0
        choices.append((runs, count, cheaper))
    choices.sort(key=lambda c: (-len(c[0]), sum(_size(r) for r in c[0][len(c[0]) - c[1]:])))
    budget = options.write_budget * sum(f.file_size for f in written)
    picks: list[tuple[list[Run], bool]] = []
    for runs, count, cheaper in choices:
        for n in (count, cheaper):
            cost = sum(_size(r) for r in runs[len(runs) - n:])
            if n and (cost <= budget or not picks):
                picks.append((runs[len(runs) - n:], n == len(runs)))
                budget -= cost
                break
    return _commit(table, plan, picks)


@dataclass(frozen=True)
class DueBucket:
    """A bucket due for compaction, for a maintenance service to schedule (and lease)."""

    partition_id: int | None
    bucket: int | None
    runs: int  # the runs (deletion vectors: files) it holds
    bytes: int  # what compacting it reads: the runs (live bytes of the files) it would merge


def due_buckets(table: TableState) -> list[DueBucket]:
    """The buckets of the current snapshot that a write in ``compaction.mode`` inline would
    compact: more than ``compaction.max-runs`` runs. Most runs first."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return []
    options = compaction_options(table.record.properties)
    plan = _load(table, base)
    due = []
    for (pid, bucket), runs in plan.buckets.items():
        if len(runs) > options.max_runs:
            count = _count(plan, runs, options)
            due.append(DueBucket(pid, bucket, len(runs),
                                 sum(_size(r) for r in runs[len(runs) - count:])))
    return sorted(due, key=lambda d: (-d.runs, d.bytes))


def _commit(table: TableState, plan: _Plan, picks: list[tuple[list[Run], bool]],
            log: tuple[list[NewFile], dict[str, str]] = ([], {})) -> CompactionResult:
    """Merge each pick's runs into one run and commit them all as one snapshot, with the
    changelog files ``log`` (and their summary entries) of a full-compaction table."""
    log_files = log[0]
    if not picks and not log_files:
        return CompactionResult(None)
    merge = table.merge_spec()
    assert merge is not None
    added: list[NewFile] = []
    writers: list[DataFileWriter] = []
    inputs = [[f for run in runs for f in run] for runs, _ in picks]
    partitions = {pid: (path, values) for pid, path, values in
                  table.metastore.partitions(table.record.table_id)} if picks else {}
    # One choice of dictionary columns for all the buckets, made on the first one's rows.
    dictionary: Future[list[str]] = Future()

    runs_written: dict[int, pa.Table] = {}  # for the lookup changelog's cache of decoded runs

    def merge_and_write(index: int) -> DataFileWriter:
        files = inputs[index]
        try:
            merged = merge_pick(table, pick_split(plan, merge, files),
                                keep_retractions=keeps_retractions(plan, picks[index][1]),
                                held=held_runs(table, files))
            if index == 0:
                dictionary.set_result(dictionary_columns(merged))
        except BaseException as exc:
            if index == 0:
                dictionary.set_exception(exc)
            raise
        runs_written[index] = merged
        return _write_compacted(table, merged, files, partitions, dictionary.result())

    # Buckets are read and merged two at a time (Arrow and numpy release the GIL), each handed
    # to the write pool as soon as it is merged.
    pool = ContextPool(max_workers=2, thread_name_prefix="arrowlake-compact")
    futures: list[Future[DataFileWriter]] = []
    try:
        futures = [pool.submit(merge_and_write, i) for i in range(len(inputs))]
        writers = [future.result() for future in futures]
        added = close_all(writers)
        outcome = commit_merged(table, plan.base, inputs, added, log)
    except BaseException:
        # Let every bucket's task end first: one still merging would start a writer later.
        pool.shutdown(wait=True, cancel_futures=True)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().abort()
        table.discard([*added, *log_files])
        raise
    finally:
        pool.shutdown(wait=False)
    if not outcome.dropped:
        remember_runs(table, [(w, runs_written[i]) for i, w in enumerate(writers)])
    return outcome


def commit_merged(table: TableState, base: int, inputs: Sequence[Sequence[FileTask]],
                  added: list[NewFile], log: ChangelogFiles = ([], {})) -> CompactionResult:
    """Commit the merged runs ``added`` in place of the runs ``inputs`` (one list per bucket),
    with the changelog files ``log``, as one snapshot on ``base``. A lost race (another
    compaction or rewrite took some of these runs first) deletes ``added`` and the log and
    drops the compaction."""
    log_files, log_summary = log
    removed = [f for files in inputs for f in files]
    # A full-compaction changelog holds for the snapshot it was computed on only: a commit
    # landing first makes it computed again on the newer snapshot (else that commit's rows
    # would fall between two full compactions' changes and never be streamed).
    logged = log_summary.get("changelog") == changelog.FULL_COMPACTION_DIFF
    try:
        for _ in range(CHANGELOG_ATTEMPTS):
            change = SnapshotChange(
                kind="compact", schema_id=table.record.current_schema_id, add=added,
                remove=[f.file_id for f in removed],
                removed_rows=sum(f.row_count for f in removed),
                summary={"buckets": len(inputs), **log_summary}, changelog=log_files,
                on_rebase=_changelog_outdated(base) if logged else None,
                deletion_vectors=False)
            try:
                result = table.metastore.commit(table.record.table_id, base, change)
            except _ChangelogOutdated:
                table.discard(log_files)
                log_files = []
                table.refresh()
                current = table.current_snapshot_id
                assert current is not None  # commits landed after base
                base = current
                log_files, log_summary = changelog.full_compaction_changelog(table, base)
                continue
            return CompactionResult(result.snapshot_id, len(inputs), len(removed), len(added),
                                    removed_bytes=sum(f.file_size for f in removed),
                                    added_bytes=sum(f.file_size for f in added))
    except CommitConflict:
        pass
    except BaseException:
        table.discard([*added, *log_files])
        raise
    table.discard([*added, *log_files])
    return CompactionResult(None, dropped=True)


#: How often a full compaction computes its changelog again because commits landed first.
CHANGELOG_ATTEMPTS = 5


class _ChangelogOutdated(CommitConflict):
    """Commits landed after the snapshot a full compaction's changelog was computed on."""


def _changelog_outdated(base: int) -> Callable[[pa.Table], None]:
    def refuse(added: pa.Table) -> None:
        raise _ChangelogOutdated(
            f"Commits landed after snapshot {base}, which this full compaction's changelog "
            "was computed on")

    return refuse


def pick_split(plan: _Plan, merge: MergeSpec, files: list[FileTask]) -> Split:
    """The split that reads one pick's runs ``files`` for :func:`merge_pick` (picklable)."""
    return make_splits(plan.view, files, columns=plan.view.schema.names,
                       expr=AlwaysTrue(), target_bytes=1 << 62, merge=merge)[0]


def keeps_retractions(plan: _Plan, whole: bool) -> bool:
    """Whether merging a pick keeps its tombstones (``whole``: the pick is all the bucket's
    runs). They may go once nothing older is left to hide, except with a sequence field: a
    version written later with a smaller sequence value must stay hidden."""
    return not whole or plan.sequence_field


def merge_pick(table: TableState, split: Split, *, keep_retractions: bool,
               held: Mapping[int, pa.Table] | None = None) -> pa.Table:
    """The runs of one bucket that ``split`` (:func:`pick_split`) reads, merged into the rows
    of one run (:func:`_as_run`). Reads only what ``table`` (or a
    :class:`~arrowlake.table.staged.WriteTarget` of it) holds, so it runs in any process."""
    merge = split.merge
    assert merge is not None
    files = list(split.files)
    columns = list(split.columns)
    # Partition columns are constant in a bucket: merged without them (as reads do),
    # then added back from the files' partition values.
    fill = fillable(split.partition_by, files,
                    [c for c in merge.partition_by if c in columns]) \
        if [k for k in merge.key if k not in merge.partition_by] else []
    rows = merge_bucket(split, files, [c for c in columns if c not in fill],
                        AlwaysTrue(), keep_retractions=keep_retractions, held=held)
    for name, value in zip(fill, partition_scalars(split, files[0], fill, {}), strict=True):
        rows = rows.append_column(name, constant_column(value, rows.num_rows))
    return _as_run(table, rows)


def _as_run(table: TableState, merged: pa.Table) -> pa.Table:
    """Merged rows (with ``_row_kind`` and ``_seq``) in the run schema of ``table``."""
    schema = run_schema(table.schema)
    merged = merged.drop_columns([SEQUENCE]).rename_columns(
        [KIND_COLUMN if c == ROW_KIND else c for c in merged.column_names if c != SEQUENCE]
    ).select(schema.names)
    return pa.Table.from_arrays(merged.columns, schema=schema)


def _write_compacted(table: TableState, merged: pa.Table, runs: list[FileTask],
                     partitions: Mapping[int, tuple[str, str]],
                     dictionary: Sequence[str]) -> DataFileWriter:
    """Start writing one bucket's merged rows (:func:`_as_run`) as a run that keeps the inputs'
    sequence range, dictionary-encoding the columns ``dictionary``; the caller closes the
    writer (or aborts it). ``partitions``: the table's partitions' paths and values by id."""
    rec = table.record
    seq_min = min(f.seq_min or 0 for f in runs)
    seq_max = max(f.seq_max or 0 for f in runs)
    sample = runs[0]
    rel = table.storage.relative(rec.location, sample.path)
    directory = rel.rsplit("/", 1)[0]
    part: tuple[str | None, str | None] = (None, None) if sample.partition_id is None else \
        partitions.get(sample.partition_id, (None, None))
    key = list(rec.primary_key)
    target = FileTarget(table.storage, rec.location, merged.schema, rec.current_schema_id,
                        WriteOptions.from_properties(rec.properties, sorted_runs=True))
    writer = DataFileWriter(
        target, directory, partition_path=part[0], partition_values=part[1],
        bucket=sample.bucket,
        file_hook=lambda t: {"key_min": key_json(t.slice(0, 1), key),
                             "key_max": key_json(t.slice(t.num_rows - 1, 1), key),
                             "seq_min": seq_min, "seq_max": seq_max},
        dictionary=dictionary)
    try:
        writer.write_all(merged)
    except BaseException:
        writer.abort()
        raise
    return writer
