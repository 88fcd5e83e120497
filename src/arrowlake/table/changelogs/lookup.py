"""The ``lookup`` changelog producer: exact changes with before-images, computed at write
time (see :mod:`arrowlake.table.changelogs.producers` for what each producer writes).

The versions of the keys a write touches are read (the new runs whole; of the committed runs
only the touched buckets' rows whose key the write touches, files and row groups outside the
written key range pruned) and merged by the table's engine without and with the new runs;
the two are compared per key, vectorized. The lookup starts while the write's runs are still
being encoded (:func:`finish_with_lookup`); a commit that lands first never fails the write:
:func:`rebase` brings the changelog up to date inside the commit's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.expressions import AlwaysTrue, Expr
from arrowlake.io.stats import encode_scalar
from arrowlake.io.writer import (
    DataFileWriter,
    close_all,
    shared_executor,
)
from arrowlake.merge import ROW_KIND, Deduplicate, RowKind
from arrowlake.merge.equality import same_rows
from arrowlake.merge.read import Bucket, MergeSpec, merge_together
from arrowlake.merge.runs import KIND_COLUMN, KIND_FIELD, KIND_FIELD_ID, key_bounds_compare
from arrowlake.merge.versions import is_retraction
from arrowlake.metastore.store import NewFile
from arrowlake.scan.planning import TableView, file_schemas, file_tasks
from arrowlake.scan.read import read_tagged
from arrowlake.scan.split import FileTask, Split
from arrowlake.schema import field_id
from arrowlake.table.changelogs.files import (
    AFTER_COLUMN,
    UNCHANGED,
    Part,
    bucketed,
    diff,
    start_parts,
    write_parts,
)
from arrowlake.table.keys.lookup import key_range_filter
from arrowlake.table.keys.run_cache import (
    RUNS,
    DecodedRun,
    as_ints,
    decoded_runs,
    integer_like,
    keep_runs,
    run_cache_bytes,
)

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

def _key_stats_only(table: TableState, files: Sequence[NewFile]) -> list[NewFile]:
    """Format-2 changelog files with the statistics of their key columns only: the other
    columns' hold only the rows with their own values, so they could not prune the rows
    referenced from the runs."""
    schema = table.schema
    keep = {str(field_id(schema.field(k))) for k in table.record.primary_key}
    keep.add(str(KIND_FIELD_ID))
    out = []
    for f in files:
        stats = json.loads(f.stats)
        out.append(replace(f, stats=json.dumps(
            {k: v for k, v in stats.items() if k in keep or not k.isdigit()},
            separators=(",", ":"))))
    return out


def _new_tasks(table: TableState, runs: Sequence[NewFile], seq: int) -> list[FileTask]:
    """The written (not yet committed) runs as file tasks ordered after every committed run."""
    storage, loc = table.storage, table.record.location
    known = table.metastore.partition_ids(table.record.table_id)
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

    def counted(self, parts: Iterable[Part]) -> Iterator[Part]:
        for part in parts:
            codes = part[3].column(ROW_KIND).to_numpy()
            updates = int((codes == int(RowKind.UPDATE_BEFORE)).sum())
            self.shown += 2 * updates + int((codes == int(RowKind.DELETE)).sum())
            self.referenced += updates + int((codes == UNCHANGED).sum())
            yield part

    @property
    def rows(self) -> int:
        return self.shown + self.additions - self.referenced


# A part's partition path and bucket: where its changelog file goes.
_Where = tuple[str | None, int]
# A place of the write's runs: partition path, partition values JSON and bucket.
_Place = tuple[str | None, str | None, int]


@dataclass(eq=False)
class LookupChangelog:
    """The lookup changelog of a write's runs until the write commits: the changes on
    snapshot ``looked_up_at``, per partition and bucket, held in memory with the runs they were
    computed from, and the changelog files written of them. A commit that lands first makes
    only the changes of the keys it also wrote computed again (:func:`rebase`)."""

    runs: dict[_Where, tuple[_Place, DecodedRun]]  # the write's rows, per partition and bucket
    looked_up_at: int | None
    referencing: bool  # the parts are in format 2 (see AFTER_COLUMN), else in format 1
    additions: int  # format 2: the runs' rows that are not retractions (+I unless referred to)
    parts: dict[_Where, Part] = field(default_factory=dict)
    written: dict[_Where, list[NewFile]] = field(default_factory=dict)

    @property
    def files(self) -> list[NewFile]:
        return [f for where in sorted(self.written, key=_order) for f in self.written[where]]

    @property
    def empty(self) -> bool:
        """Whether the changes yield no row (in format 2: markers of unchanged rows only)."""
        if not self.referencing:
            return not any(part[3].num_rows for part in self.parts.values())
        tally = _Tally(self.additions)
        for _ in tally.counted(self.parts.values()):
            pass
        return tally.rows == 0

    @property
    def format2(self) -> bool:
        """Whether the changelog is committed in format 2: a changelog of no rows is committed
        as one without files (format 1), which streams skip at planning."""
        return self.referencing and not self.empty

    def record(self, parts: Iterable[Part]) -> Iterator[Part]:
        """``parts``, each kept as it passes."""
        for part in parts:
            where = (part[0], part[2])
            held = self.parts.get(where)
            self.parts[where] = part if held is None else (
                *part[:3], pa.concat_tables([held[3], part[3].cast(held[3].schema)]))
            yield part

    def add(self, table: TableState, files: Sequence[NewFile]) -> None:
        if self.referencing:
            files = _key_stats_only(table, files)
        for f in files:
            self.written.setdefault((f.partition_path, int(f.bucket or 0)), []).append(f)


def _order(where: _Where) -> tuple[str, int]:
    return where[0] or "", where[1]


def _settle(table: TableState, state: LookupChangelog, changed: Iterable[_Where] = ()) -> None:
    """Bring the written files of ``state`` in line with its parts: the files of the parts
    ``changed`` and of parts no longer committed deleted, every missing one written. A
    changelog of no rows has no files; it is committed in format 1."""
    changed = set(changed)
    needed = set() if state.empty else {w for w, p in state.parts.items() if p[3].num_rows}
    for where in [w for w in state.written if w not in needed or w in changed]:
        table.discard(state.written.pop(where))
    missing = [state.parts[w] for w in sorted(needed - set(state.written), key=_order)]
    if missing:
        state.add(table, write_parts(table, missing, referencing=state.referencing))


def _start_lookup(table: TableState, base: int | None,
                  runs: dict[_Where, tuple[_Place, DecodedRun]], logs: list[DataFileWriter],
                  dictionary: Sequence[str] | None = None
                  ) -> LookupChangelog:
    """The lookup changelog of ``runs`` on snapshot ``base``, its parts handed to the write
    pool as they are computed, each writer appended to ``logs`` (the caller closes them and
    adds their files to the state, or aborts them on an error)."""
    parts, tally = _look_up(table, base, runs)
    state = LookupChangelog(runs, base, tally is not None,
                            tally.additions if tally is not None else 0)
    start_parts(table, state.record(parts), logs, referencing=state.referencing,
                 dictionary=dictionary)
    return state


def finish_with_lookup(table: TableState, base: int | None, writers: Sequence[DataFileWriter],
                       written: Sequence[tuple[DataFileWriter, pa.Table]]
                       ) -> tuple[list[NewFile], LookupChangelog]:
    """Finish the data ``writers`` (their runs ``written`` already on the write pool) while the
    lookup changelog of those runs on snapshot ``base`` is computed and handed to the pool: the
    lookup needs the runs' rows, not their files. Returns the runs' files and the changelog;
    on any error every file of both is deleted and the error re-raised."""
    logs: list[DataFileWriter] = []
    files: list[NewFile] = []
    changelog: list[NewFile] = []
    state: LookupChangelog | None = None
    try:
        runs = decoded_runs(table, written)
        by_where = _by_where(table, [((w.partition_path, w.partition_values, int(w.bucket or 0)),
                                      run) for w, run in runs])
        state = _start_lookup(table, base, by_where, logs,
                              dictionary=writers[0].dictionary if writers else None)
        files = close_all(writers)
        changelog = close_all(logs)
        state.add(table, changelog)
        changelog = []
        _settle(table, state)
    except BaseException:
        for writer in [*writers, *logs]:
            writer.abort()
        table.discard([*files, *changelog, *(state.files if state is not None else [])])
        raise
    keep_runs(table, runs)
    return files, state


def _by_where(table: TableState, pairs: Iterable[tuple[_Place, DecodedRun]]
              ) -> dict[_Where, tuple[_Place, DecodedRun]]:
    """The runs per partition and bucket (several runs of one place joined, in order)."""
    first = table.record.primary_key[0]
    fast = integer_like(table.schema.field(first).type)
    grouped: dict[_Where, tuple[_Place, list[DecodedRun]]] = {}
    for place, run in pairs:
        grouped.setdefault((place[0], place[2]), (place, []))[1].append(run)
    return {where: (place, runs[0] if len(runs) == 1 else DecodedRun.of(
                pa.concat_tables([r.rows for r in runs]), first, fast))
            for where, (place, runs) in grouped.items()}


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


def _plain_newest_wins(spec: MergeSpec) -> bool:
    """Whether the merged row of a key is simply its newest version (gone if that is a
    retraction): deduplicate without a sequence field or ignore-delete."""
    engine = spec.engine
    return (type(engine) is Deduplicate and not engine.ignore_delete
            and spec.sequence_field is None)


def lookup_files(table: TableState, base: int | None, runs: Sequence[NewFile]) -> LookupChangelog:
    """The lookup changelog of written runs on snapshot ``base``, from their files (or the
    cache of decoded runs), its files written."""
    rec = table.record
    view = table.view(base, current_schema=True)
    first = rec.primary_key[0]
    fast = integer_like(view.schema.field(first).type)
    fresh = _new_tasks(table, runs, (base or 0) + 1)
    decoded = _runs(view, fresh, AlwaysTrue(), first, fast, run_cache_bytes(rec.properties))
    by_where = _by_where(table, [
        ((written.partition_path, written.partition_values, int(written.bucket or 0)),
         decoded[task.file_id][1])
        for task, written in zip(fresh, runs, strict=True) if task.file_id in decoded])
    logs: list[DataFileWriter] = []
    changelog: list[NewFile] = []
    state: LookupChangelog | None = None
    try:
        state = _start_lookup(table, base, by_where, logs)
        changelog = close_all(logs)
        state.add(table, changelog)
        changelog = []
        _settle(table, state)
    except BaseException:
        for writer in logs:
            writer.abort()
        table.discard([*changelog, *(state.files if state is not None else [])])
        raise
    return state


def _look_up(table: TableState, base: int | None, runs: Mapping[_Where, tuple[_Place, DecodedRun]]
             ) -> tuple[Iterable[Part], _Tally | None]:
    """The exact changes that committing ``runs`` (their places and rows) on top of snapshot
    ``base`` makes, per partition and bucket (table columns + ``_row_kind`` codes), see the
    module docs, and in format 2 (see :data:`AFTER_COLUMN`) the tally of the rows they yield.

    Only the touched keys' versions are read and merged: the new runs whole, and from the
    committed runs of their buckets the rows whose key one of them writes (files and row groups
    outside the written key range skipped by their statistics, or found in the cache of
    decoded runs). Partitions are found as they are now: one created since the runs were
    written holds the versions another writer committed there."""
    rec = table.record
    view = table.view(base, current_schema=True)
    known = table.metastore.partition_ids(rec.table_id)
    pids: dict[str, int] = {}
    fresh = iter(range(-1, -(1 << 30), -1))
    place: dict[_Unit, tuple[str | None, str | None, int]] = {}
    new: list[tuple[_Unit, DecodedRun]] = []
    for (ppath, pvalues, bucket), run in runs.values():
        if ppath is not None and ppath not in pids:
            pid = known.get(ppath, pvalues)
            # None: a new partition, with no committed runs in it.
            pids[ppath] = next(fresh) if pid is None else pid
        unit = (pids[ppath] if ppath is not None else None, bucket)
        place.setdefault(unit, (ppath, pvalues, bucket))
        new.append((unit, run))
    return _lookup(table, view, base, new, place)


def _lookup(table: TableState, view: TableView, base: int | None,
            new: Sequence[tuple[_Unit, DecodedRun]],
            place: Mapping[_Unit, tuple[str | None, str | None, int]]
            ) -> tuple[Iterable[Part], _Tally | None]:
    """The changes of the new runs ``new`` (their unit and rows, ordered after every run of
    snapshot ``base``), per unit at ``place``; in format 2 (see :data:`AFTER_COLUMN`) with
    the tally of the rows they yield (counted as the parts are taken)."""
    rec = table.record
    key = list(rec.primary_key)
    spec = table.merge_spec()
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
        live = table.metastore.live_files(
            rec.table_id, base, buckets=sorted({b for _, b in touched if b is not None}))
        if live.num_rows:
            committed = [t for t in file_tasks(view, live)
                         if (t.partition_id, t.bucket) in touched]
    expr: Expr = AlwaysTrue()
    if committed:
        # Only the written key range: files and row groups outside it are pruned by their
        # statistics.
        expr = key_range_filter(first, pa.chunked_array(
            [c for _, run in new for c in run.rows.column(first).chunks],
            view.schema.field(first).type))
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
    return (list(bucketed(table, changes)) if changes.num_rows else []), None


def _as_ready(pending: Sequence[tuple[tuple[str | None, str | None, int], Future[pa.Table]]]
              ) -> Iterator[Part]:
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
    changed = stays & ~same_rows(before, after.select(values_of).take(pa.array(had)))
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


def rebase(table: TableState, state: LookupChangelog, added: pa.Table) -> bool:
    """Bring a lookup changelog up to date with the commits that landed after the snapshot it
    was computed on; called inside the commit's transaction, which holds the table, with the
    files those commits added (``added``). Returns whether its files changed.

    A compaction changes no value (its outputs keep the sequence range of their inputs, all
    from before it): it changes nothing here. A new run (sequence range of its own snapshot)
    in a bucket of the write changes the before-images (and, for merging engines, the
    after-images) of the keys it wrote: of the write's keys, those are looked up again on the
    current snapshot, and their changes replace theirs. A commit that removed files otherwise
    (an overwrite) may have changed any key: everything is looked up again."""
    rec = table.record
    seen = state.looked_up_at
    current = table.metastore.current_snapshot_id(rec.table_id)
    if current is None or current == seen:
        return False
    snaps = table.metastore.snapshots(rec.table_id).select(
        ["snapshot_id", "kind", "removed_files"])
    if seen is not None:
        snaps = snaps.filter(pc.greater(snaps.column("snapshot_id"), seen))
    removed = pc.and_(pc.greater(snaps.column("removed_files"), 0),
                      pc.not_equal(snaps.column("kind"), "compact"))
    if pc.any(removed).as_py():
        _look_up_again(table, state, current, None)
        return True
    added_at = added.column("added_snapshot")
    newer = pc.and_(
        pc.greater(added_at, -1 if seen is None else seen),
        pc.fill_null(pc.equal(added.column("seq_max"), added_at), True))  # not a rewrite
    buckets = pa.array(sorted({w[1] for w in state.runs}), pa.int32())
    newer = pc.and_(newer, pc.is_in(added.column("bucket"), value_set=buckets))
    new = added.filter(pc.fill_null(newer, True))
    hit = _rewritten(table, state, current, new) if new.num_rows else {}
    if not hit:
        state.looked_up_at = current  # still exact on the current snapshot
        return False
    _look_up_again(table, state, current, hit)
    return True


def _rewritten(table: TableState, state: LookupChangelog, current: int, new: pa.Table
               ) -> dict[_Where, np.ndarray]:
    """Per partition and bucket of the write, the positions of its rows whose key one of the
    runs ``new`` wrote (compared on the first key column: for a composite key a superset,
    which costs a little work and changes nothing)."""
    rec = table.record
    view = table.view(current, current_schema=True)
    first = rec.primary_key[0]
    first_type = view.schema.field(first).type
    fast = integer_like(first_type)
    # Per bucket: the write's first-key range in the stored form of key bounds (what
    # task.key_range holds: integers for temporal keys, never Python datetimes); buckets in
    # ``unbounded`` have keys without such a form.
    ranges: dict[int, tuple[Any, Any]] = {}
    unbounded: set[int] = set()
    comparable = key_bounds_compare([first_type])
    write_keys: list[pa.Array] = []
    for place, run in state.runs.values():
        column = run.rows.column(first)
        if len(column) == 0:
            continue
        write_keys.extend(column.chunks)
        low, high = (encode_scalar(v) for v in pc.min_max(column).values())
        bucket = place[2]
        if not comparable or low is None or high is None:
            unbounded.add(bucket)
            continue
        held = ranges.get(bucket)
        ranges[bucket] = (low, high) if held is None else (
            min(low, held[0]), max(high, held[1]))

    def may_hold(task: FileTask) -> bool:
        bucket = int(task.bucket or 0)
        if bucket in unbounded:
            return True
        span = ranges.get(bucket)
        if span is None:
            return False
        if task.key_range is None:
            return True
        try:
            return bool(task.key_range[0][0] <= span[1] and task.key_range[1][0] >= span[0])
        except TypeError:
            return True

    tasks = [t for t in file_tasks(view, new) if may_hold(t)]
    if not tasks:
        return {}
    expr = key_range_filter(first, pa.chunked_array(write_keys, first_type))
    theirs: dict[int, list[pa.Array]] = {}
    for task, run in _runs(view, tasks, expr, first, fast,
                           run_cache_bytes(rec.properties)).values():
        theirs.setdefault(int(task.bucket or 0), []).extend(run.rows.column(first).chunks)
    hit: dict[_Where, np.ndarray] = {}
    for where, (_, run) in state.runs.items():
        written = theirs.get(where[1])
        if not written or run.rows.num_rows == 0:
            continue
        values = pa.chunked_array(written, first_type)
        if fast and run.keys is not None:
            mask = np.isin(run.keys, as_ints(values))
        else:
            mask = pc.is_in(run.rows.column(first), value_set=pc.unique(values)).to_numpy(
                zero_copy_only=False)
        if mask.any():
            hit[where] = np.flatnonzero(mask)
    return hit


def _look_up_again(table: TableState, state: LookupChangelog, current: int,
                   hit: Mapping[_Where, np.ndarray] | None) -> None:
    """The changes of the write's rows at the positions ``hit`` (every row when None)
    computed again on snapshot ``current``, replacing theirs, and the changelog files of the
    parts that changed written again."""
    if hit is None:
        runs = state.runs
    else:
        runs = {where: (state.runs[where][0], _taken(state.runs[where][1], at))
                for where, at in hit.items()}
    parts, tally = _look_up(table, current, runs)
    got: dict[_Where, Part] = {}
    for found in parts:
        where = (found[0], found[2])
        held = got.get(where)
        got[where] = found if held is None else (
            *found[:3], pa.concat_tables([held[3], found[3].cast(held[3].schema)]))
    if hit is not None and (tally is not None) != state.referencing:
        # The other format (the committed runs changed how they can be searched): all again.
        _look_up_again(table, state, current, None)
        return
    if hit is None:
        changed = set(state.parts) | set(got)
        state.parts = got
        state.referencing = tally is not None
        state.additions = tally.additions if tally is not None else 0
    else:
        first = table.record.primary_key[0]
        for where, at in hit.items():
            keys = runs[where][1].rows.column(first).combine_chunks()
            part: Part | None = got.get(where)
            if part is not None and state.referencing:
                # Positions among the looked-up rows, to positions among all the run's rows.
                after = part[3].column(AFTER_COLUMN)
                valid = after.is_valid().to_numpy(zero_copy_only=False)
                moved = at[pc.fill_null(after, 0).to_numpy().astype(np.int64)]
                part = (*part[:3], part[3].set_column(
                    part[3].schema.get_field_index(AFTER_COLUMN), AFTER_COLUMN,
                    pa.array(moved.astype(np.int32), mask=~valid)))
            held = state.parts.get(where)
            if held is not None:
                kept = held[3].filter(pc.invert(pc.is_in(held[3].column(first), value_set=keys)))
                part = (*held[:3], kept) if part is None else (
                    *held[:3], pa.concat_tables([kept, part[3].cast(kept.schema)]))
            if part is not None:
                state.parts[where] = part
        changed = set(hit)
    state.looked_up_at = current
    _settle(table, state, changed)


def _taken(run: DecodedRun, at: np.ndarray) -> DecodedRun:
    """The rows of ``run`` at positions ``at`` (increasing) as a run."""
    return DecodedRun(run.rows.take(pa.array(at)),
                      None if run.keys is None else run.keys[at], run.sorted_unique)
