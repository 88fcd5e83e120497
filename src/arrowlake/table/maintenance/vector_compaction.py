"""Compaction of merge-on-write tables: for space and file count, never for read correctness.

Reads of a table with deletion vectors merge nothing, however many files a bucket holds; what
grows with writes is the bytes a read decodes and then drops (deleted rows) and the number of
files. Per partition and bucket, a compaction rewrites into one file the live rows of

- every file whose deleted fraction reaches ``deletion-vectors.rewrite-threshold`` (default
  0.3): it holds that much dead weight;
- the newest files the universal picking of
  :func:`~arrowlake.table.maintenance.compaction.pick_runs` chooses by live bytes once the
  bucket holds more than ``compaction.max-runs`` files (each
  write adds one file per bucket it touches).

``compact(full=True)`` rewrites every bucket with more than one file or any deleted row (on a
``full-compaction`` table, committed with its changelog: :mod:`.vector_changelog`). After a
write, the buckets it touched are compacted within ``compaction.write-budget`` times the bytes
it wrote (the first bucket due always), as for merge-on-read tables. The output keeps the
sequence range of its inputs. Writes that mark rows of its inputs deleted while it runs do
not void it: it drops those rows from its output (found by each output row's origin, the file
and position it came from), rewrites the output and commits on the newer snapshot, a few times
at most. A compaction whose inputs another commit removed gives way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, DataFileError
from arrowlake.expressions import AlwaysTrue
from arrowlake.io.pools import ContextPool
from arrowlake.io.stats import decode_values
from arrowlake.io.writer import DataFileWriter, close_all, dictionary_columns, write_started
from arrowlake.merge.versions import sortable_key
from arrowlake.metastore.records import NewFile, SnapshotChange, StaleVectors
from arrowlake.scan.planning import TableView, file_tasks, file_vectors, make_splits
from arrowlake.scan.read import read_split_table
from arrowlake.scan.split import FileTask
from arrowlake.table.changelogs.vectors import full_compaction_changelog, refuse_rebase
from arrowlake.table.keys.lookup import lookup_columns, remember_written
from arrowlake.table.keys.runs import start_group_writers
from arrowlake.table.maintenance.compaction import (
    CompactionResult,
    DueBucket,
    compaction_options,
    pick_runs,
)
from arrowlake.table.options.primary_key import changelog_producer, rewrite_threshold

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

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


def _groups(table: TableState, base: int, buckets: Sequence[int] | None
            ) -> tuple[list[list[FileTask]], TableView]:
    view = table.view(base, current_schema=True)
    live = table.metastore.live_files(table.record.table_id, base,
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


def compact_vectors(table: TableState, *, full: bool = False, touched: Iterable[int] | None = None,
                    budget: int | None = None, background: bool = False) -> CompactionResult:
    """Compact the buckets of a merge-on-write table (those numbered in ``touched`` only, when
    given), rewriting at most ``budget`` live bytes after the first bucket due.

    ``background``: a compaction beside the table's writers (the maintenance service) takes
    its buckets one at a time, each written before the next is read, leaving the other core
    to them; otherwise (inline, or ``compact()``) two at a time (:func:`_rewrite`)."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return CompactionResult(None)
    props = table.record.properties
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
    # A full compaction of a full-compaction table commits its changelog even when no file
    # needs rewriting (the first one after writes that each left one file per bucket).
    logged = full and changelog_producer(table) == "full-compaction"
    if not picks and not logged:
        return CompactionResult(None)
    return _commit(table, view, base, picks, logged=logged, background=background)


def due_vector_buckets(table: TableState) -> list[DueBucket]:
    """The buckets of the current snapshot with files past the rewrite threshold, or more
    than ``compaction.max-runs`` files: what :func:`compact_vectors` would rewrite, with the
    live bytes it would read. Most files first."""
    table.refresh()
    base = table.current_snapshot_id
    if base is None:
        return []
    groups, _ = _groups(table, base, None)
    props = table.record.properties
    due = []
    for files in groups:
        picked = _pick(files, props, False)
        if picked:
            due.append(DueBucket(picked[0].partition_id, picked[0].bucket, len(files),
                                 _Pick(picked).live_bytes))
    return sorted(due, key=lambda d: (-d.runs, d.bytes))


#: How often a compaction that other writes raced catches up with them before it gives way.
ATTEMPTS = 5

#: A row's origin: its file's number in the pick above these bits, its position below.
_POSITION_BITS = 40


@dataclass
class _Output:
    """One pick rewritten: its live rows sorted by key, each row's origin, the files holding
    them (written, not yet committed)."""

    pick: _Pick
    rows: pa.Table
    origin: np.ndarray
    files: list[NewFile] = field(default_factory=list)


def _read_pick(table: TableState, view: TableView, pick: _Pick) -> _Output:
    """The live rows of a pick's files, sorted by key, with the file and position each row
    comes from (so that rows deleted while the compaction runs can be found in its output)."""
    schema = table.schema

    def read(task: FileTask) -> pa.Table:
        split = make_splits(view, [task], columns=schema.names, expr=AlwaysTrue(),
                            target_bytes=1 << 62)[0]
        return read_split_table(split)

    parts, origins = [], []
    # The files of one pick are read one after another: reading them at once did not shorten
    # inline compactions measurably (bench/pk.py long run), and took CPU from writers when the
    # maintenance service compacts. Picks are read two at a time (:func:`_rewrite`).
    for number, task in enumerate(pick.files):
        part = read(task)
        kept = np.arange(task.row_count, dtype=np.int64)
        if task.deletes is not None and task.deletes.cardinality:
            alive = np.ones(task.row_count, dtype=bool)
            alive[task.deletes.positions(view.storage, task.path).astype(np.int64)] = False
            kept = kept[alive]
        if len(kept) != part.num_rows:
            raise DataFileError(
                f"{task.path} read {part.num_rows} live rows where its row count and deletion "
                f"vector say {len(kept)}: the file or its vector is damaged")
        parts.append(part)
        origins.append((np.int64(number) << _POSITION_BITS) | kept)
    rows = pa.concat_tables(parts)
    origin = np.concatenate(origins)
    # A pick's rows share their partition values: the key's other columns order them.
    partition = set(table.record.partition_by)
    key = [k for k in table.record.primary_key if k not in partition] \
        or list(table.record.primary_key)
    image = sortable_key(rows, key)
    if image is not None:
        if len(image) < 2 or bool(np.all(image[1:] > image[:-1])):
            # One file's rows (a file past the rewrite threshold), in key order already.
            return _Output(pick, rows, origin)
        order = np.argsort(image, kind="stable")
    else:
        order = pc.sort_indices(rows.select(key), [(k, "ascending") for k in key]).to_numpy()
    return _Output(pick, rows.take(pa.array(order)), origin[order])


def _start_output(table: TableState, out: _Output, writers: list[DataFileWriter],
                  dictionary: Sequence[str] | None) -> tuple[DataFileWriter, pa.Table]:
    """Hand an output's rows to the write pool as its bucket's new file(s)."""
    group = (_partition_scalars(table, out.pick.files[0]), out.pick.files[0].bucket or 0,
             out.rows)
    return start_group_writers(table, [group], table.schema, writers, dictionary)[0]


def _finish_outputs(table: TableState, outputs: Sequence[_Output],
                    started: Sequence[tuple[DataFileWriter, pa.Table]]) -> None:
    """After the writers of ``outputs`` (``started``, in the same order) closed: give each
    output its files, which keep the sequence range of the files they replace."""
    rec = table.record
    # The next write in this process finds the new files' keys without reading them.
    remember_written(table.storage, rec.location, started, table.schema,
                     lookup_columns(rec.primary_key, rec.partition_by))
    for out, (writer, _) in zip(outputs, started, strict=True):
        low = min(f.seq_min or 0 for f in out.pick.files)
        high = max(f.seq_max or 0 for f in out.pick.files)
        out.files = [replace(f, seq_min=low, seq_max=high) for f in writer.files]


def _write_output(table: TableState, out: _Output) -> None:
    """Write one output's rows (again, after a racing write deleted some of them)."""
    _, started = write_started(lambda writers: [_start_output(table, out, writers, None)])
    _finish_outputs(table, [out], started)


def _rewrite(table: TableState, view: TableView, picks: Sequence[_Pick]) -> list[_Output]:
    """Read, sort and write every pick. Two picks are read and sorted at a time (Arrow and
    numpy release the GIL), each handed to the write pool as soon as it is sorted, so that one
    pick's compression overlaps the next one's reading; all writers finish at the end. One
    choice of dictionary columns serves every output: the first pick's, so that the same rows
    give the same files whichever pick is sorted first."""
    # Set by the first pick (its task starts first); the others wait for it.
    dictionary: Future[list[str]] = Future()

    def one(index: int) -> tuple[_Output, list[DataFileWriter],
                                 tuple[DataFileWriter, pa.Table]]:
        try:
            out = _read_pick(table, view, picks[index])
            if index == 0:
                dictionary.set_result(dictionary_columns(out.rows))
        except BaseException as exc:
            if index == 0:
                dictionary.set_exception(exc)
            raise
        writers: list[DataFileWriter] = []
        try:
            return out, writers, _start_output(table, out, writers, dictionary.result())
        except BaseException:
            for writer in writers:
                writer.abort()
            raise

    if len(picks) == 1:
        done = [one(0)]
    else:
        pool = ContextPool(max_workers=2, thread_name_prefix="arrowlake-compact")
        futures = [pool.submit(one, index) for index in range(len(picks))]
        try:
            done = [future.result() for future in futures]
        except BaseException:
            # Let every pick's task end first: one still reading would start a writer later.
            pool.shutdown(wait=True, cancel_futures=True)
            for future in futures:
                if future.done() and not future.cancelled() and future.exception() is None:
                    for writer in future.result()[1]:
                        writer.abort()
            raise
        finally:
            pool.shutdown(wait=False)
    writers = [w for _, ws, _ in done for w in ws]
    try:
        close_all(writers)
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    outputs = [out for out, _, _ in done]
    _finish_outputs(table, outputs, [s for _, _, s in done])
    return outputs


def _catch_up(table: TableState, outputs: list[_Output]) -> int | None:
    """After other commits marked rows of the compacted files deleted: drop those rows from
    the outputs (rewriting the outputs they were in) and return the snapshot the outputs now
    match; None when another commit removed one of the files (the compaction gives way)."""
    table.refresh()
    base = table.current_snapshot_id
    view = table.view(base, current_schema=True)
    ids = [task.file_id for out in outputs for task in out.pick.files]
    live = table.metastore.live_files(table.record.table_id, base)
    if not set(ids) <= set(live.column("file_id").to_pylist()):
        return None
    now = dict(zip(ids, file_vectors(view, ids), strict=True))
    for out in outputs:
        gone = []
        files = list(out.pick.files)
        for number, task in enumerate(files):
            ref = now[task.file_id]
            before = task.deletes.cardinality if task.deletes is not None else 0
            if ref is None or ref.cardinality == before:
                continue
            positions = ref.positions(view.storage, task.path).astype(np.int64)
            if before:
                assert task.deletes is not None
                old = task.deletes.positions(view.storage, task.path).astype(np.int64)
                positions = positions[~np.isin(positions, old, assume_unique=True)]
            gone.append((np.int64(number) << _POSITION_BITS) | positions)
            files[number] = replace(task, deletes=ref)
        if not gone:
            continue
        out.pick = _Pick(files)
        dead = np.isin(out.origin, np.concatenate(gone))
        if dead.any():
            out.rows = out.rows.filter(pa.array(~dead))
            out.origin = out.origin[~dead]
            table.discard(out.files)
            out.files = []
            _write_output(table, out)
    return base


def _commit(table: TableState, view: TableView, base: int, picks: list[_Pick], *,
            logged: bool = False, background: bool = False) -> CompactionResult:
    """Rewrite ``picks`` and commit them as one snapshot. Writes that mark rows of the picked
    files deleted meanwhile do not void it: their rows are dropped from the output (rewritten
    without them) and the commit is tried again on the newer snapshot, up to
    :data:`ATTEMPTS` times. Only a commit that removed a picked file makes it give way.

    ``logged``: a full compaction of a ``full-compaction`` table, committed with the net
    change since the previous one (:mod:`arrowlake.table.changelogs.vectors`). That change holds
    for the snapshot it was computed on only, so any commit landing first makes the attempt
    start again on the newer snapshot, the change computed again."""
    rec = table.record
    outputs: list[_Output] = []
    log: list[NewFile] = []
    try:
        if background:
            for pick in picks:
                outputs.append(_read_pick(table, view, pick))
                _write_output(table, outputs[-1])
        else:
            outputs = _rewrite(table, view, picks)
        for _ in range(ATTEMPTS):
            removed = [f for out in outputs for f in out.pick.files]
            added = [f for out in outputs for f in out.files]
            summary: dict[str, Any] = {"buckets": len(outputs)}
            if logged:
                table.discard(log)
                log = []
                log, noted = full_compaction_changelog(table, base)
                summary.update(noted)
                if not outputs and not log:
                    return CompactionResult(None)  # nothing changed since the last one
            change = SnapshotChange(
                kind="compact", schema_id=rec.current_schema_id, add=added,
                remove=[f.file_id for f in removed],
                removed_rows=sum(f.live_rows for f in removed),
                summary=summary, changelog=log,
                on_rebase=refuse_rebase(base) if logged else None,
                expect_vectors={f.file_id: f.deletes.since if f.deletes else None
                                for f in removed}, deletion_vectors=True)
            try:
                result = table.metastore.commit(rec.table_id, base, change)
            except StaleVectors:
                caught_up = _catch_up(table, outputs)
                if caught_up is None:
                    break
                base = caught_up
                continue
            except CommitConflict:
                break
            return CompactionResult(result.snapshot_id, len(outputs), len(removed), len(added),
                                    removed_bytes=sum(f.file_size for f in removed),
                                    added_bytes=sum(f.file_size for f in added))
        table.discard([*log, *(f for out in outputs for f in out.files)])
        return CompactionResult(None, dropped=True)
    except BaseException:
        table.discard([*log, *(f for out in outputs for f in out.files)])
        raise


def _partition_scalars(table: TableState, task: FileTask) -> tuple[pa.Scalar, ...]:
    names = list(table.record.partition_by)
    if not names:
        return ()
    values = json.loads(task.partition_values or "[]")
    return tuple(decode_values([v], table.schema.field(n).type)[0]
                 for n, v in zip(names, values, strict=True))
