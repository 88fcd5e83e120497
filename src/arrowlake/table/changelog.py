"""Changelog producers of primary-key tables: changelog files written with each commit.

The table property ``changelog-producer`` (``create_table(..., changelog_producer=...)``)
decides what change streams read for a snapshot of a primary-key table:

- ``none`` (default): no changelog files; streams read the runs as written.
- ``input``: the input rows exactly as given to ``upsert``/``write_changes``/``merge``/
  ``delete`` (duplicates and ``-U`` rows included, before the write merged repeated keys),
  one changelog file per partition and bucket, in input order.
- ``lookup``: exact changes with before-images, computed at write time. The versions of the keys a
  write touches are read (the new runs whole; of the committed runs only the touched buckets'
  rows whose key the write touches, files and row groups outside the written key range pruned)
  and merged by the table's engine without and with the new runs; the two are compared per
  key, vectorized: ``+I`` new key, ``-U`` old / ``+U`` new row where any value
  changed, ``-D`` with the deleted row's values, nothing where no value changed. Both merges use
  the table's merge engine, so every engine is exact (partial-update and aggregation emit the
  merged row). Where a key's merged row is its newest version, the changelog copies no row
  that the write's runs hold (format 2, see :data:`AFTER_COLUMN`). The lookup starts while
  the write's runs are still being encoded (it needs their rows, not their files:
  :func:`finish_with_lookup`), and an error deletes the runs and the changelog files alike.
  When another commit touching the same buckets lands first, the changelog is computed again
  on top of it before the commit (the runs are kept).

- ``full-compaction``: writes yield nothing; ``compact(full=True)`` commits the difference
  between the merged table at the previous full compaction and now (``+I``, ``-U``/``+U``,
  ``-D``), see :func:`full_compaction_changelog`.

Changelog files are recorded with the commit (``SnapshotChange.changelog``): read by their
snapshot only, never part of a scan, and deleted when that snapshot expires.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
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
    dictionary_columns,
    shared_executor,
    split_by_columns,
)
from arrowlake.merge import ROW_KIND, Deduplicate, RowKind
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.read import Bucket, MergeSpec, merge_together
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD, KIND_FIELD_ID
from arrowlake.merge.versions import is_retraction
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import TableView, file_schemas, file_tasks
from arrowlake.scan.read import read_tagged
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import FIELD_ID_KEY, field_id
from arrowlake.table.run_cache import (
    RUNS,
    DecodedRun,
    decoded_runs,
    integer_like,
    keep_runs,
    run_cache_bytes,
)
from arrowlake.table.writes import WriteResult, _discard, _result, commit_files

if TYPE_CHECKING:
    from arrowlake.table.table import Table

PRODUCERS = ("none", "input", "lookup", "full-compaction")
_INDEX = "__al_row"

#: Lookup changelogs in format 2 (written when a key's merged row is its newest version:
#: ``deduplicate`` without a sequence field or ``ignore-delete``, a one-column integer-like key)
#: copy no row that the runs of their snapshot hold. Per partition and bucket, a changelog file
#: (possibly none) holds, in key order, the ``-U`` rows, each with AFTER_COLUMN: the position,
#: among the rows of the runs the snapshot added there (the runs in key order), of its new row,
#: read right after it as ``+U``; the ``-D`` rows (AFTER_COLUMN null); and, with the row kind
#: UNCHANGED and null values, the positions of new rows that changed nothing. Every other
#: addition of those runs (a row that is not a retraction) is read after them as ``+I``, in
#: run order. Snapshots whose summary lacks REFERENCING_SUMMARY hold every row's values
#: (format 1, still read as such; the other lookup paths write it too).
AFTER_COLUMN = "_al_after"
UNCHANGED = -1
AFTER_FIELD_ID = KIND_FIELD_ID + 1
AFTER_FIELD = pa.field(AFTER_COLUMN, pa.int32(), nullable=True,
                       metadata={FIELD_ID_KEY: str(AFTER_FIELD_ID).encode()})
#: The snapshot summary entry that marks a lookup changelog in format 2.
REFERENCING_SUMMARY = "changelog-format"
REFERENCING_FORMAT = 2


def log_schema(schema: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """The schema of format-2 lookup changelog files of a table schema: its columns, non-key
    ones nullable (null in UNCHANGED rows), the row kind and AFTER_COLUMN."""
    keys = set(key)
    fields = [f if f.name in keys else f.with_nullable(True) for f in schema]
    return pa.schema(fields, metadata=schema.metadata).append(KIND_FIELD).append(AFTER_FIELD)


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
    return _write_parts(table, _bucketed(table, rows))


# A changelog file's place and rows: (partition path, partition values JSON, bucket, rows with
# table columns + ``_row_kind`` codes).
_Part = tuple[str | None, str | None, int, pa.Table]


def _write_parts(table: Table, parts: Iterable[_Part], *, referencing: bool = False
                 ) -> list[NewFile]:
    """One changelog file per part, each handed to the write pool as soon as it is cut, so the
    next part is computed while it is written. ``referencing``: lookup format 2 (see
    :data:`AFTER_COLUMN`)."""
    writers: list[DataFileWriter] = []
    files: list[NewFile] = []
    try:
        _start_parts(table, parts, writers, referencing=referencing)
        files = close_all(writers)
    except BaseException:
        for writer in writers:
            writer.abort()
        _discard(table, files)
        raise
    return files


def _start_parts(table: Table, parts: Iterable[_Part], writers: list[DataFileWriter], *,
                 referencing: bool = False, dictionary: Sequence[str] | None = None) -> None:
    """Hand each part to the write pool as a changelog file, its writer appended to ``writers``
    (the caller closes them, or aborts them on an error). ``referencing``: in lookup format 2,
    with AFTER_COLUMN. ``dictionary``: the columns to
    dictionary-encode when already chosen (the write's runs hold the same columns' values),
    else chosen from the first part."""
    rec = table._record
    schema = log_schema(table.schema, rec.primary_key) if referencing \
        else table.schema.append(KIND_FIELD)
    target = FileTarget(storage=table._storage, location=rec.location, schema=schema,
                        schema_id=rec.current_schema_id,
                        options=WriteOptions.from_properties(rec.properties))
    dictionary = list(dictionary) if dictionary is not None else None
    for ppath, pvalues, bucket, rows in parts:
        if rows.num_rows == 0:
            continue
        rows = rows.rename_columns([KIND_COLUMN if c == ROW_KIND else c
                                    for c in rows.column_names])
        out = pa.Table.from_arrays(rows.select(schema.names).columns, schema=schema)
        if dictionary is None:
            # One choice of encodings for all the files of the write. In format 2, made on the
            # rows with values (the null values of markers would look like repeats).
            dictionary = dictionary_columns(_own_rows(out)) if referencing \
                else dictionary_columns(out)
        directory = "/".join(p for p in ("changelog", ppath, f"bucket-{bucket}") if p)
        writer = DataFileWriter(target, directory, partition_path=ppath,
                                partition_values=pvalues, bucket=bucket,
                                dictionary=dictionary)
        writers.append(writer)
        writer.write_all(out)


def _own_rows(rows: pa.Table) -> pa.Table:
    """A sample of the format-2 changelog rows that hold values (not UNCHANGED markers),
    without the position column."""
    sample = rows.slice(0, 65_536)  # dictionary_columns samples the first 16,384 of these
    return sample.filter(pc.not_equal(sample.column(KIND_COLUMN), UNCHANGED)).drop_columns(
        [AFTER_COLUMN])


def _key_stats_only(table: Table, files: Sequence[NewFile]) -> list[NewFile]:
    """Format-2 changelog files with the statistics of their key columns only: the other
    columns' hold only the rows with their own values, so they could not prune the rows
    referenced from the runs."""
    schema = table.schema
    keep = {str(field_id(schema.field(k))) for k in table._record.primary_key}
    keep.add(str(KIND_FIELD_ID))
    out = []
    for f in files:
        stats = json.loads(f.stats)
        out.append(replace(f, stats=json.dumps(
            {k: v for k, v in stats.items() if k in keep or not k.isdigit()},
            separators=(",", ":"))))
    return out


def _new_tasks(table: Table, runs: Sequence[NewFile], seq: int) -> list[FileTask]:
    """The written (not yet committed) runs as file tasks ordered after every committed run."""
    storage, loc = table._storage, table._record.location
    known = table._metastore.partition_ids(table._record.table_id)
    pids: dict[str, int] = {}
    fresh = iter(range(-1, -(1 << 30), -1))
    for f in runs:
        if f.partition_path is not None and f.partition_path not in pids:
            pid = known.get(f.partition_path, f.partition_values)
            # None: a new partition, with no committed runs in it.
            pids[f.partition_path] = next(fresh) if pid is None else pid
    return [
        FileTask(-1 - i, storage.join(loc, f.path), f.file_size, f.row_count, f.schema_id,
                 f.bucket, seq, seq, pids.get(f.partition_path) if f.partition_path else None,
                 None, False, f.partition_values)
        for i, f in enumerate(runs)
    ]


_Unit = tuple[int | None, int | None]  # (partition id, bucket)


class _Tally:
    """How many rows a format-2 changelog yields, counted as its parts are taken: its -U
    (each with a +U), -D, and the runs' additions not referred to (+I)."""

    def __init__(self, additions: int) -> None:
        self.additions = additions
        self.shown = 0
        self.referenced = 0

    def counted(self, parts: Iterable[_Part]) -> Iterator[_Part]:
        for part in parts:
            codes = part[3].column(ROW_KIND).to_numpy()
            updates = int((codes == int(RowKind.UPDATE_BEFORE)).sum())
            self.shown += 2 * updates + int((codes == int(RowKind.DELETE)).sum())
            self.referenced += updates + int((codes == UNCHANGED).sum())
            yield part

    @property
    def rows(self) -> int:
        return self.shown + self.additions - self.referenced


def _settled(table: Table, files: list[NewFile], tally: _Tally | None
             ) -> tuple[list[NewFile], bool]:
    """The changelog files to commit and whether they are in format 2: a changelog of no rows
    is committed as one without files (format 1), which streams skip at planning."""
    if tally is None:
        return files, False
    if tally.rows == 0:
        _discard(table, files)  # markers of unchanged rows only
        return [], False
    return _key_stats_only(table, files), True


@dataclass(frozen=True)
class LookupChangelog:
    """The written changelog files of a lookup, and whether they are in format 2."""

    files: list[NewFile]
    referencing: bool


def finish_with_lookup(table: Table, base: int | None, writers: Sequence[DataFileWriter],
                       written: Sequence[tuple[DataFileWriter, pa.Table]]
                       ) -> tuple[list[NewFile], LookupChangelog]:
    """Finish the data ``writers`` (their runs ``written`` already on the write pool) while the
    lookup changelog of those runs on snapshot ``base`` is computed and handed to the pool: the
    lookup needs the runs' rows, not their files. Returns the runs' files and the changelog
    files; on any error every file of both is deleted and the error re-raised."""
    logs: list[DataFileWriter] = []
    files: list[NewFile] = []
    changelog: list[NewFile] = []
    try:
        runs = decoded_runs(table, written)
        parts, tally = lookup_written(table, base, runs)
        _start_parts(table, parts, logs, referencing=tally is not None,
                     dictionary=writers[0].dictionary if writers else None)
        files = close_all(writers)
        changelog = close_all(logs)
        changelog, referencing = _settled(table, changelog, tally)
    except BaseException:
        for writer in [*writers, *logs]:
            writer.abort()
        _discard(table, [*files, *changelog])
        raise
    keep_runs(table, runs)
    return files, LookupChangelog(changelog, referencing)


def _read_versions(view: TableView, tasks: Sequence[FileTask], expr: Expr
                   ) -> dict[int, tuple[FileTask, pa.Table]]:
    """Every row of ``tasks`` matching ``expr`` (key columns only: pushed down, row groups
    pruned by their statistics), all table columns plus the stored row kind, per file."""
    if not tasks:
        return {}
    schema = view.schema.append(KIND_FIELD)
    schemas = {sid: s.append(KIND_FIELD) for sid, s in file_schemas(view, tasks).items()}
    split = Split(view.storage, tuple(tasks), schemas, schema, tuple(schema.names), expr,
                  partition_by=tuple(view.record.partition_by), table=view.record.full_name)
    batches: dict[int, list[pa.RecordBatch]] = {}
    found: dict[int, FileTask] = {}
    for task, batch in read_tagged(split):
        batches.setdefault(task.file_id, []).append(batch)
        found[task.file_id] = task
    out_schema = split.output_schema()
    return {fid: (found[fid], pa.Table.from_batches(b, schema=out_schema))
            for fid, b in batches.items()}


def _runs(view: TableView, tasks: Sequence[FileTask], expr: Expr, first: str, fast: bool,
          limit: int) -> dict[int, tuple[FileTask, DecodedRun]]:
    """The rows of ``tasks`` as runs. With a cache (``limit`` bytes) whole files, from the
    cache or decoded and kept in it; without one only the rows matching ``expr``."""
    schema_id = view.record.current_schema_id
    out: dict[int, tuple[FileTask, DecodedRun]] = {}
    missing = []
    for task in tasks:
        run = RUNS.get((task.path, schema_id)) if limit else None
        if run is None:
            missing.append(task)
        else:
            out[task.file_id] = (task, run)
    for fid, (task, rows) in _read_versions(view, missing,
                                            AlwaysTrue() if limit else expr).items():
        run = DecodedRun.of(rows, first, fast)
        if limit:
            RUNS.put((task.path, schema_id), run, limit)
        out[fid] = (task, run)
    return out


def _touched_rows(run: DecodedRun, first: str, keys: pa.Array | np.ndarray) -> pa.Table:
    """The rows of one run whose first key column holds one of ``keys`` (for a one-column key,
    exactly the touched keys' versions; for a composite key a superset, which changes nothing:
    a key the write does not touch merges to the same row before and after it)."""
    rows = run.rows
    if rows.num_rows == 0 or len(keys) == 0:
        return rows.slice(0, 0)
    if isinstance(keys, np.ndarray):
        # ``keys`` sorted and unique; a run is sorted by key with unique keys, so each touched
        # key is found by binary search in it (no hash table over the run's keys).
        values = run.keys
        assert values is not None  # integer-like keys
        if not run.sorted_unique:
            return rows.filter(pa.array(np.isin(values, keys)))  # not a sorted run
        at, hit = _find(values, keys)
        return rows.take(pa.array(at[hit]))
    try:
        return rows.filter(pc.is_in(rows.column(first), value_set=keys))
    except pa.ArrowNotImplementedError:
        return rows  # no kernel for the key's type: every version (a superset) is merged


def _find(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``keys`` is in the strictly increasing ``values``: positions and whether
    it is there (binary search)."""
    at = np.searchsorted(values, keys)
    hit = at < len(values)
    hit[hit] = values[at[hit]] == keys[hit]
    return at, hit


def _merge_units(spec: MergeSpec, units: dict[_Unit, list[tuple[int, pa.Table]]]
                 ) -> pa.Table | None:
    """Each unit's versions ``(seq, rows)`` merged by the table's engine (units apart)."""
    buckets = []
    for unit, parts in units.items():
        pieces = [(seq, batch) for seq, rows in parts for batch in rows.to_batches()
                  if batch.num_rows]
        if pieces:
            buckets.append(Bucket(list(unit), [b for _, b in pieces], [s for s, _ in pieces],
                                  pieces[0][1].schema, sum(b.num_rows for _, b in pieces)))
    if not buckets:
        return None
    return pa.concat_tables(merge_together(spec, buckets))


def _pairs(left: pa.Table, right: pa.Table, key: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row index pairs ``(i, j)`` with equal keys (keys are unique on each side)."""
    if left.num_rows == 0 or right.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(key) == 1:
        # One hash lookup of each left key among the right ones (cheaper than a join).
        try:
            at = pc.index_in(left.column(key[0]),
                             value_set=right.column(key[0]).combine_chunks())
        except pa.ArrowNotImplementedError:
            pass  # no kernel for the key's type: the join below
        else:
            i = np.flatnonzero(at.is_valid().to_numpy(zero_copy_only=False))
            return i, np.asarray(at.drop_null().to_numpy(zero_copy_only=False), np.int64)
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
        if x.null_count or y.null_count:
            eq = pc.or_kleene(eq, pc.and_(pc.is_null(x), pc.is_null(y)))
        same &= pc.fill_null(eq, False).to_numpy(zero_copy_only=False)
    return same


def _plain_newest_wins(spec: MergeSpec) -> bool:
    """Whether the merged row of a key is simply its newest version (gone if that is a
    retraction): deduplicate without a sequence field or ignore-delete."""
    engine = spec.engine
    return (type(engine) is Deduplicate and not engine.ignore_delete
            and spec.sequence_field is None)


def lookup_parts(table: Table, base: int | None, runs: Sequence[NewFile]
                 ) -> tuple[Iterable[_Part], _Tally | None]:
    """The exact changes that committing ``runs`` on top of snapshot ``base`` makes, per
    partition and bucket (table columns + ``_row_kind`` codes), see the module docs, and in
    format 2 (see :data:`AFTER_COLUMN`) the tally of the rows they yield.

    Only the touched keys' versions are read and merged: the new runs whole, and from the
    committed runs of their buckets the rows whose key one of them writes (files and row groups
    outside the written key range skipped by their statistics, or found in the cache of
    decoded runs)."""
    rec = table._record
    view = table._view(base, current_schema=True)
    first = rec.primary_key[0]
    fast = integer_like(view.schema.field(first).type)
    fresh = _new_tasks(table, runs, (base or 0) + 1)
    decoded = _runs(view, fresh, AlwaysTrue(), first, fast, run_cache_bytes(rec.properties))
    place: dict[_Unit, tuple[str | None, str | None, int]] = {}
    for task, written in zip(fresh, runs, strict=True):
        place.setdefault((task.partition_id, task.bucket),
                         (written.partition_path, written.partition_values,
                          int(written.bucket or 0)))
    new = [((task.partition_id, task.bucket), run) for task, run in decoded.values()]
    return _lookup(table, view, base, new, place)


def lookup_written(table: Table, base: int | None,
                   written: Sequence[tuple[DataFileWriter, DecodedRun]]
                   ) -> tuple[Iterable[_Part], _Tally | None]:
    """:func:`lookup_parts` of runs still being written: ``written`` pairs each run's writer
    (its place) with the run's rows, so nothing waits for their files."""
    rec = table._record
    view = table._view(base, current_schema=True)
    known = table._metastore.partition_ids(rec.table_id)
    pids: dict[str, int] = {}
    fresh = iter(range(-1, -(1 << 30), -1))
    place: dict[_Unit, tuple[str | None, str | None, int]] = {}
    new: list[tuple[_Unit, DecodedRun]] = []
    for writer, run in written:
        ppath = writer.partition_path
        if ppath is not None and ppath not in pids:
            pid = known.get(ppath, writer.partition_values)
            # None: a new partition, with no committed runs in it.
            pids[ppath] = next(fresh) if pid is None else pid
        unit = (pids[ppath] if ppath is not None else None, writer.bucket)
        place.setdefault(unit, (ppath, writer.partition_values, int(writer.bucket or 0)))
        new.append((unit, run))
    return _lookup(table, view, base, new, place)


def _lookup(table: Table, view: TableView, base: int | None,
            new: Sequence[tuple[_Unit, DecodedRun]],
            place: Mapping[_Unit, tuple[str | None, str | None, int]]
            ) -> tuple[Iterable[_Part], _Tally | None]:
    """The changes of the new runs ``new`` (their unit and rows, ordered after every run of
    snapshot ``base``), per unit at ``place``; in format 2 (see :data:`AFTER_COLUMN`) with
    the tally of the rows they yield (counted as the parts are taken)."""
    rec = table._record
    key = list(rec.primary_key)
    spec = table._merge_spec()
    assert spec is not None  # a primary-key table
    names = view.schema.names
    first = key[0]
    fast = integer_like(view.schema.field(first).type)
    limit = run_cache_bytes(rec.properties)
    new_seq = (base or 0) + 1
    # The touched first-key values of each unit, and over all of them their range.
    touched: dict[_Unit, Any] = {}
    # A run of no rows (a batch of retractions that the engine drops: first-row, ignore-delete)
    # touches no key.
    new = [(unit, run) for unit, run in new if run.rows.num_rows]
    for unit, run in new:
        touched.setdefault(unit, []).append(run)
    new_rows: dict[_Unit, DecodedRun] = {}
    for unit, parts in touched.items():
        if not fast:
            touched[unit] = pc.unique(pa.chunked_array(
                [c for p in parts for c in p.rows.column(first).chunks],
                view.schema.field(first).type))
            continue
        rows = parts[0] if len(parts) == 1 else DecodedRun.of(
            pa.concat_tables([p.rows for p in parts]), first, fast)
        new_rows[unit] = rows
        assert rows.keys is not None
        # One run per unit is sorted with unique keys already.
        touched[unit] = rows.keys if rows.sorted_unique else np.unique(rows.keys)
    committed: list[FileTask] = []
    if base is not None and touched:
        live = table._metastore.live_files(
            rec.table_id, base, buckets=sorted({b for _, b in touched if b is not None}))
        if live.num_rows:
            committed = [t for t in file_tasks(view, live)
                         if (t.partition_id, t.bucket) in touched]
    expr: Expr = AlwaysTrue()
    if committed:
        # Only the written key range: files and row groups outside it are pruned by their
        # statistics.
        low, high = pc.min_max(pa.chunked_array(
            [c for _, run in new for c in run.rows.column(first).chunks],
            view.schema.field(first).type)).values()
        expr = and_all([col(first) >= low.as_py(), col(first) <= high.as_py()])
    old = _runs(view, committed, expr, first, fast, limit)
    olds: dict[_Unit, list[tuple[int, DecodedRun]]] = {unit: [] for unit in touched}
    for task, run in old.values():
        olds[(task.partition_id, task.bucket)].append((task.seq_max or 0, run))
    if (len(key) == 1 and _plain_newest_wins(spec) and len(new_rows) == len(touched)
            and all(r.sorted_unique for r in new_rows.values())
            and all(r.sorted_unique for runs_ in olds.values() for _, r in runs_)):
        # Buckets computed on the write pool (numpy and Arrow release the GIL), each handed to
        # the caller, which writes it, as soon as it is ready.
        pool = shared_executor()
        pending = [(place[unit], pool.submit(_newest_wins_changes, names, key, rows,
                                                 olds[unit]))
                   for unit, rows in new_rows.items()]
        tally = _Tally(sum(int((~is_retraction(r.rows.column(KIND_COLUMN).to_numpy())).sum())
                           for r in new_rows.values()))
        return tally.counted(_as_ready(pending)), tally
    before = {unit: [(seq, _touched_rows(run, first, touched[unit])) for seq, run in runs_]
              for unit, runs_ in olds.items()}
    after = {unit: [*parts] for unit, parts in before.items()}
    for unit, run in new:
        after[unit].append((new_seq, run.rows))
    merged_before = _merge_units(spec, before)
    merged_after = _merge_units(spec, after)
    empty = view.schema.empty_table()
    changes = diff(empty if merged_before is None else merged_before.select(names),
                   empty if merged_after is None else merged_after.select(names), key)
    return (list(_bucketed(table, changes)) if changes.num_rows else []), None


def _as_ready(pending: Sequence[tuple[tuple[str | None, str | None, int], Future[pa.Table]]]
              ) -> Iterator[_Part]:
    """The parts computed on the pool, in order; those not taken yet are cancelled if the
    caller stops early (a failed write)."""
    try:
        for place, future in pending:
            yield (*place, future.result())
    finally:
        for _, future in pending:
            future.cancel()


def _newest_wins_changes(names: Sequence[str], key: Sequence[str], new: DecodedRun,
                         old: Sequence[tuple[int, DecodedRun]]) -> pa.Table:
    """The changes of one bucket's new run over its committed runs when a key's merged row is
    its newest version (:func:`_plain_newest_wins`): the before-image of each new key is its
    version in the newest committed run holding it, found by binary search, newest run first;
    the after-image is the new row itself, so the changelog refers to it by its position in
    the run (:data:`AFTER_COLUMN`) instead of copying it. No merge, no join: takes of the
    before-images and of the key cut the output."""
    keys = new.keys
    assert keys is not None
    n = len(keys)
    columns = list(names)
    key_set = set(key)
    values_of = [c for c in columns if c not in key_set]  # what before-images need
    after = new.rows.select(columns)
    added = ~is_retraction(new.rows.column(KIND_COLUMN).to_numpy())  # a row after the write
    # Newest first; among equal sequence numbers the later one, as a merge orders them.
    order = sorted(range(len(old)), key=lambda i: old[i][0])
    open_ = np.arange(n)
    pieces: list[pa.Table] = []
    index: list[np.ndarray] = []  # per piece: the new rows (keys) its before-images belong to
    for i in reversed(order):
        run = old[i][1]
        values = run.keys
        assert values is not None
        if len(values) == 0 or len(open_) == 0:
            continue
        # Only the open keys inside the run's key range can be in it (both are sorted): new
        # keys above every committed key (inserts) are not searched run after run.
        wanted = keys[open_]
        lo = int(np.searchsorted(wanted, values[0], "left"))
        hi = int(np.searchsorted(wanted, values[-1], "right"))
        if lo >= hi:
            continue
        at, hit = _find(values, wanted[lo:hi])
        if not hit.any():
            continue
        mine, at = open_[lo:hi][hit], at[hit]
        still = np.ones(len(open_), dtype=bool)
        still[lo:hi][hit] = False
        open_ = open_[still]
        # A retraction as the newest version: the key has no row before the write.
        live = ~is_retraction(run.rows.column(KIND_COLUMN).to_numpy()[at])
        if not live.all():
            mine, at = mine[live], at[live]
        pieces.append(run.rows.select(values_of).take(pa.array(at)))
        index.append(mine)
    if pieces:
        before = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        had = np.concatenate(index)
    else:
        before, had = after.select(values_of).slice(0, 0), np.zeros(0, np.int64)
    # Before-images stay where they were taken; key order (a few sorted runs: merged in O(n))
    # goes into the output's one take below.
    by_key = np.argsort(had, kind="stable") if len(pieces) > 1 else np.arange(len(had))
    # Per before-image: the key's row after the write (a tombstone's values where deleted).
    stays = added[had]
    changed = stays & ~_same(before, after.select(values_of).take(pa.array(had)))
    # The changelog rows (format 2, see AFTER_COLUMN), in key order: -U rows (each followed,
    # when read, by the new row at its AFTER_COLUMN as +U), -D rows, and a marker for each new
    # row that changed nothing; every other addition of the run is read as +I after them.
    same = stays & ~changed
    updated = by_key[changed[by_key]]  # before-image rows, in key order
    gone = by_key[~stays[by_key]]
    unchanged = by_key[same[by_key]]
    u, g = len(updated), len(gone)
    own = np.concatenate([updated, gone, np.zeros(len(unchanged), dtype=np.int64)])
    row = had[np.concatenate([updated, gone, unchanged])]  # the new row of each changelog row
    kinds = np.empty(len(own), dtype=np.int8)
    kinds[:u] = int(RowKind.UPDATE_BEFORE)
    kinds[u:u + g] = int(RowKind.DELETE)
    kinds[u + g:] = UNCHANGED
    refers = np.ones(len(own), dtype=bool)
    refers[u:u + g] = False
    key_values = after.select(list(key)).take(pa.array(row))
    if not values_of:
        own_values = key_values
    elif len(unchanged):
        own_values = before.take(pa.array(own, mask=kinds == UNCHANGED))
    else:
        own_values = before.take(pa.array(own))
    arrays = [(key_values if c in key_set else own_values).column(c) for c in columns]
    arrays += [pa.array(kinds), pa.array(row.astype(np.int32), mask=~refers)]
    return pa.Table.from_arrays(arrays, names=[*columns, ROW_KIND, AFTER_COLUMN])


def _bucketed(table: Table, rows: pa.Table) -> Iterator[_Part]:
    """``rows`` cut by partition and bucket, each part in input order."""
    rec = table._record
    buckets = int(rec.buckets or 1)  # set for every primary-key table
    with_bucket = rows.append_column("_al_bucket",
                                     bucket_of(rows, list(rec.primary_key), buckets))
    as_batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in with_bucket.columns],
                                          schema=with_bucket.schema)
    for values, part in split_by_columns(as_batch, [*rec.partition_by, "_al_bucket"]):
        shown = [v.as_py() if v.is_valid else None for v in values[:-1]]
        ppath = partition_path(rec.partition_by, shown) if rec.partition_by else None
        pvalues = json.dumps([encode_partition_value(v) for v in values[:-1]]) \
            if rec.partition_by else None
        table_part = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) \
            else part
        yield ppath, pvalues, int(values[-1].as_py()), table_part.drop_columns(["_al_bucket"])


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
    return _changes(b_pair.filter(pa.array(changed)), a_pair.filter(pa.array(changed)),
                    before.filter(pa.array(gone)), after.filter(pa.array(new)))


def _changes(old_rows: pa.Table, new_rows: pa.Table, gone: pa.Table, inserted: pa.Table
             ) -> pa.Table:
    """The change rows (table columns + ``_row_kind``): ``-U`` old / ``+U`` new per updated
    key, interleaved so each before-image directly precedes its new row, then ``-D`` for
    ``gone`` and ``+I`` for ``inserted``."""
    n = old_rows.num_rows
    updates = pa.concat_tables([old_rows, new_rows.cast(old_rows.schema)])
    order = np.empty(2 * n, dtype=np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n, 2 * n)
    updates = updates.take(pa.array(order))
    kinds = np.empty(2 * n, dtype=np.int8)
    kinds[0::2] = int(RowKind.UPDATE_BEFORE)
    kinds[1::2] = int(RowKind.UPDATE_AFTER)
    out = [updates.append_column(ROW_KIND, pa.array(kinds))]
    for part, kind in ((gone, RowKind.DELETE), (inserted.cast(old_rows.schema), RowKind.INSERT)):
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


# -- committing -------------------------------------------------------------------------------


class _StaleChangelog(CommitConflict):
    """A lookup changelog computed on a snapshot that a concurrent commit changed."""


def commit_runs(table: Table, kind: str, base: int | None, runs: list[NewFile],
                rows: pa.Table, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None,
                lookup_changelog: LookupChangelog | None = None) -> WriteResult:
    """Commit written runs with the changelog the table's producer asks for. ``on_rebase`` is
    the write's own conflict check; its CommitConflict reaches the caller unchanged.
    ``lookup_changelog``: a ``lookup`` table's changelog of ``runs`` on ``base``, already
    written (:func:`finish_with_lookup`); computed again only if a commit lands first."""
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
        try:
            referencing = False
            if producer == "input":
                changelog = _write(table, rows) if rows.num_rows else []
            elif attempt == 0 and lookup_changelog is not None:
                changelog, referencing = lookup_changelog.files, lookup_changelog.referencing
            else:
                parts, tally = lookup_parts(table, looked_up_at, runs)
                changelog, referencing = _settled(
                    table, _write_parts(table, parts, referencing=tally is not None), tally)
        except BaseException:
            _discard(table, runs)  # the changelog's own files are deleted already
            raise

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
        if referencing:
            noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT
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
