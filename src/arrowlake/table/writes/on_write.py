"""Merge on write: primary-key writes that settle versions when they are written.

In a table with ``deletion-vectors.enabled`` every key lives in at most one live row. A write
(upsert, delete, change data, MERGE INTO: everything that reaches :func:`commit_on_write`)
resolves each key it writes against that row (:mod:`arrowlake.table.keys.lookup`), writes one
file per partition and bucket holding only the rows that change, and marks the replaced rows
deleted in their files' deletion vectors, in the same commit. Readers then read files minus
deleted positions, with no merge (:mod:`arrowlake.scan.deleted_rows`).

What a written key becomes, per engine:

- ``deduplicate`` without a sequence field: the write's newest version replaces the live row;
  a retraction (``-U``/``-D``) deletes it (with ``ignore-delete`` retractions are dropped).
  The current values are not read.
- ``first-row`` without a sequence field: a version of a key that is live is dropped; a new
  key's first version is written. Retractions are dropped.
- every other case (``partial-update``, ``aggregation``, any engine with a
  ``sequence_field``): the live row and the write's versions of the key are merged by the
  engine exactly as a read of merge-on-read runs would merge them (the live row as the older
  run); the result replaces the live row, or deletes it when the key's final state is deleted.
  Where the result equals the live row nothing is written for the key.

Concurrent writers: a commit whose base is not the current snapshot, and that finds files
added since in a bucket it writes, or whose vectors another commit extended meanwhile, is
:class:`~arrowlake.metastore.records.StaleVectors`: the write looks its keys up again on the
newer snapshot and commits again. So a key is never live twice, and the history equals the
writes applied in commit order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from arrowlake.errors import CommitConflict
from arrowlake.io import deletion_vectors as dv
from arrowlake.io import puffin
from arrowlake.io.stats import encode_partition_value, partition_path, partition_shown
from arrowlake.io.writer import DataFileWriter, write_started
from arrowlake.merge import ROW_KIND, SEQUENCE, Deduplicate, FirstRow, MergeEngine
from arrowlake.merge.equality import same_rows
from arrowlake.merge.versions import is_retraction, row_kinds
from arrowlake.metastore.inflight import new_file_name
from arrowlake.metastore.records import (
    CommitResult,
    NewFile,
    NewVector,
    SnapshotChange,
    StaleVectors,
)
from arrowlake.scan.planning import TableView, file_tasks
from arrowlake.scan.split import FileTask
from arrowlake.table.changelogs.files import Part, labelled_change, write_changelog, write_parts
from arrowlake.table.keys import index as key_index
from arrowlake.table.keys.lookup import (
    Lookup,
    Matches,
    Written,
    index_group,
    locate,
    locate_many,
    lookup_columns,
    match_keys,
    remember_written,
)
from arrowlake.table.keys.run_cache import remember_runs
from arrowlake.table.keys.runs import run_groups, start_group_writers
from arrowlake.table.options.primary_key import changelog_producer, merge_engine, sequence_field
from arrowlake.table.writes.change import Change, Decide, Decision
from arrowlake.table.writes.plain import WriteResult

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

_log = logging.getLogger(__name__)

#: How often a write looks its keys up again after other commits changed its buckets.
ATTEMPTS = 50
#: Attempts planned without holding the table; later ones hold it from the lookup to the
#: commit (:meth:`~arrowlake.metastore.store.Metastore.commit_holding`), so a writer that
#: others keep overtaking waits for its turn instead of failing.
FREE_ATTEMPTS = 3

_Group = tuple[tuple[pa.Scalar, ...], int, pa.Table]
_T = TypeVar("_T")


@dataclass
class _Plan:
    """What one attempt of a write changes: rows to write per group, positions to delete."""

    groups: list[_Group] = field(default_factory=list)
    tombstones: list[_Group] = field(default_factory=list)
    deletes: dict[int, list[np.ndarray]] = field(default_factory=dict)
    tasks: dict[int, FileTask] = field(default_factory=dict)
    replaced: int = 0
    #: Per group, the lookup of its keys among the group's data files.
    lookups: dict[tuple[str | None, int], Matches] = field(default_factory=dict)

    def delete(self, task: FileTask, positions: np.ndarray) -> None:
        if len(positions):
            self.tasks[task.file_id] = task
            self.deletes.setdefault(task.file_id, []).append(positions)

    @property
    def rows(self) -> int:
        return sum(g[2].num_rows for g in self.groups)


class OnWriteChange(Change):
    """A write to a merge-on-write table (upsert, change data, delete, MERGE INTO): the rows
    ``decide`` returns for a snapshot, resolved against the live rows of their keys (looked up
    on that snapshot), written where they change something, and the replaced rows marked
    deleted in their files' vectors.

    A commit that lands first in a bucket it writes, or extends a vector it extends, makes
    the lookups stale (:class:`StaleVectors`): it plans again on the newer snapshot, up to
    :data:`ATTEMPTS` times, holding the table after :data:`FREE_ATTEMPTS`. A write whose rows
    depend on the snapshot (``decides``: a delete, a merge) decides them again whenever it
    plans; when its own check finds that commits since changed what it read
    (:class:`CommitConflict`), it plans again at most ``REPLAN_ATTEMPTS`` times.
    """

    replans_on = (CommitConflict,)
    attempts = ATTEMPTS
    hold_after = FREE_ATTEMPTS

    def __init__(self, table: TableState, kind: str, decide: Decide, *, decides: bool,
                 commit_id: str | None = None, replan_attempts: int = 5) -> None:
        super().__init__(table, kind, commit_id)
        self.decide = decide
        self.decides = decides
        self.replan_attempts = replan_attempts
        self.engine = merge_engine(table)
        self.seq_field = sequence_field(table)
        self.producer = changelog_producer(table)
        # The lookup producer writes each plan's change (with before-images) as changelog
        # files, so that streams read them instead of the old files' rows.
        self.lookup_log = self.producer == "lookup"
        self.logged: list[NewFile] = []
        # New rows that do not depend on the live ones are written once per decision, whatever
        # the retries.
        self.blind = isinstance(self.engine, Deduplicate) and self.seq_field is None
        self.decision: Decision | None = None
        self.decisions = 0
        self.decided_on: int | None = None  # the snapshot the decision was made on
        self.redecide = False  # the last plan's own check found what it read changed
        # The decision's rows cut into groups, as they are cut (see _groups).
        self.incoming: list[_Group] = []
        self.additions: list[_Group] = []
        self.pending: Iterator[_Group] | None = None
        self.changelog: list[NewFile] = []
        self.files: list[NewFile] = []
        self.graves: list[NewFile] = []
        self.written = _Written([])
        self.current = _Plan()
        self.vectors: list[NewVector] = []
        self.puffin_path: str | None = None

    def _decide(self, base: int | None) -> Decision | None:
        table = self.state
        if self.decision is not None and not (self.decides and self.redecide):
            if self.decides and base is not None and base != self.decided_on \
                    and self.decision.on_rebase is not None:
                # Planned again because lookups went stale, not because what it read changed:
                # the decision stands if the commits since it was made leave what it read
                # alone (else CommitConflict, and it decides again).
                _own_check(table, self.decided_on, self.decision.on_rebase,
                           table.metastore.files_added_between(None, table.table_id,
                                                               self.decided_on, base))
            return self.decision
        self.redecide = False
        self.decided_on = base
        self.decisions += 1
        decision = self.decide(base)
        table.discard(self.changelog)
        self.changelog = []
        self.decision = decision
        if decision is None:
            return None
        # Cut lazily: the first write takes each group while the pool encodes the last one.
        self.incoming, self.additions = [], []
        self.pending = iter(run_groups(table, decision.rows)) if decision.rows.num_rows \
            else None
        if self.producer == "input" and decision.rows.num_rows:
            # The rows exactly as given, committed with the write even when it changes none.
            self.changelog = write_changelog(table, decision.rows)
        return decision

    def _cut(self) -> Iterator[_Group]:
        """The decision's groups not cut yet, each kept in ``incoming`` (and its additions in
        ``additions``) as it is cut; yields what a blind replace writes of each."""
        while self.pending is not None:
            group = next(self.pending, None)
            if group is None:
                self.pending = None
                return
            self.incoming.append(group)
            if self.blind:
                added = _blind_additions([group])
                self.additions.extend(added)
                yield from added

    def _groups(self) -> list[_Group]:
        """Every group of the decision's rows (cutting what is not cut yet)."""
        for _ in self._cut():
            pass
        return self.incoming

    def plan(self, base: int | None) -> SnapshotChange | None:
        table = self.state
        _forget(table, self.puffin_path)
        self.puffin_path = None
        table.discard(self.logged)  # what the last plan's lookup found
        self.logged = []
        if self.decides and self.redecide:
            # Deciding again: what the last plan wrote follows the old decision.
            table.discard([*self.files, *self.graves])
            self.files, self.graves, self.written = [], [], _Written([])
        decision = self._decide(base)
        if decision is None or (decision.rows.num_rows == 0 and not self.changelog):
            return None
        view = table.view(base, current_schema=True)

        def plan_now(view: TableView = view) -> _Plan:
            return _plan(table, view, self._groups(), self.engine, self.seq_field,
                         before_images=self.lookup_log)

        if self.blind:
            if not self.files and not self.written.files:
                # The groups are cut as the write pool takes them, and the lookup runs while
                # it compresses the last ones.
                self.written, planned = _write(table, chain(self.additions, self._cut()),
                                               during=plan_now)
                self.files = self.written.files
                assert planned is not None
                self.current = planned
            else:
                self.current = plan_now()
            self.current.groups = self.additions
        else:
            self.current = plan_now()
            table.discard([*self.files, *self.graves])
            self.files, self.graves = [], []
            self.written, _ = _write(table, self.current.groups)
            self.files = self.written.files
            tombstones, _ = _write(table, self.current.tombstones)
            self.graves = [replace(f, content="tombstone") for f in tombstones.files]
        self.vectors, self.puffin_path = _vectors(table, self.current)
        if self.lookup_log:
            self.logged = _lookup_changelog(table, self.current)
        if not self.files and not self.vectors and not self.graves and not self.changelog:
            return None
        summary = dict(decision.summary)
        if self.producer in ("input", "full-compaction", "lookup"):
            summary["changelog"] = self.producer
        return SnapshotChange(
            kind=self.kind, schema_id=table.record.current_schema_id, add=self.files,
            vectors=self.vectors, tombstones=self.graves,
            removed_rows=sum(v.new_positions for v in self.vectors),
            commit_id=self.commit_id, changelog=[*self.changelog, *self.logged],
            summary={**summary, "replaced_rows": self.current.replaced},
            on_rebase=_rebase_check(table, base, self._groups(), decision.on_rebase),
            deletion_vectors=True)

    def should_plan_again(self, exc: CommitConflict, attempt: int) -> bool:
        if isinstance(exc, StaleVectors):
            return attempt < ATTEMPTS
        # The write's own check: what it decided on changed. Only a write that decides
        # again can get past it.
        self.redecide = self.decides
        return self.decides and self.decisions < self.replan_attempts

    def gave_up(self, exc: CommitConflict) -> CommitConflict:
        if isinstance(exc, StaleVectors):
            return CommitConflict(
                f"A {self.kind} of table '{self.state.name}' looked its keys up {ATTEMPTS} "
                "times and each time other commits changed the buckets it writes before it "
                "could commit; the table is unchanged by it. Retry later")
        if not self.decides:
            return exc  # not the write's own check: a mode switch, say
        return CommitConflict(
            f"{self.kind} on table '{self.state.name}' was planned {self.decisions} times and "
            f"each time another commit changed keys it read before it could commit ({exc}); "
            "the table is unchanged by it. Retry later, or serialize the writers of these keys")

    def finish(self, commit: CommitResult) -> WriteResult:
        table = self.state
        try:
            _advance_indexes(table, self.current, self.written, self.vectors)
        except Exception as exc:  # the write landed: the cache only speeds up the next one
            _log.warning("Snapshot %s of %s committed, but keeping its key indexes failed: %s",
                         commit.snapshot_id, table.name, exc)
        new_positions = sum(v.new_positions for v in self.vectors)
        reported = self.decision.reported if self.decision is not None else None
        added, removed = reported if reported is not None else \
            (self.current.rows, new_positions)
        return WriteResult(commit.snapshot_id, self.kind, len(self.files), 0, added,
                           removed, commit.attempts, commit.duplicate,
                           replaced=self.current.replaced,
                           buckets=tuple(sorted({b for _, b, _ in self._groups()})),
                           added_bytes=sum(f.file_size for f in self.files))

    def discard(self) -> None:
        table = self.state
        _forget(table, self.puffin_path)
        table.discard([*self.files, *self.graves, *self.changelog, *self.logged])
        self.puffin_path, self.files, self.graves, self.changelog = None, [], [], []
        self.logged = []
        self.written = _Written([])


def on_write_change(table: TableState, rows: pa.Table, kind: str, *,
                    commit_id: str | None = None, summary: dict[str, Any] | None = None
                    ) -> OnWriteChange:
    """The change of a write of ``rows`` (table schema + ``_row_kind``) that does not depend
    on the snapshot (an upsert, change data, staged rows)."""
    decision = Decision(rows, dict(summary or {}))
    return OnWriteChange(table, kind, lambda base: decision, decides=False,
                         commit_id=commit_id)


def write_tombstones(table: TableState, rows: pa.Table) -> list[NewFile]:
    """Tombstone files (content ``tombstone``, never scanned) of ``rows``: retractions (table
    schema + ``_row_kind``) whose key and sequence value keep versions arriving later with an
    older sequence value deleted, as a write's own deletes leave them."""
    groups = [(values, bucket, run.select(table.schema.names))
              for values, bucket, run in run_groups(table, rows)]
    written, _ = _write(table, groups)
    return [replace(f, content="tombstone") for f in written.files]


def _own_check(table: TableState, base: int | None, own: Callable[[pa.Table], None],
               added: pa.Table) -> None:
    """The write's own check (a delete's or merge's: did the rows it decided on change?)
    against the commits since ``base`` that added ``added``. In this mode a replaced or
    deleted row changes its file's vector, not only the files added: files whose vector grew
    since ``base`` count as new versions of the keys they hold."""
    marked = table.metastore.files_with_vectors_after(table.record.table_id, base)
    if marked.num_rows:
        newest = pa.array(np.full(marked.num_rows, np.iinfo(np.int64).max, np.int64))
        marked = marked.set_column(marked.schema.get_field_index("seq_max"), "seq_max", newest)
        added = pa.concat_tables([added, marked.cast(added.schema)])
    own(added)


def _rebase_check(table: TableState, base: int | None, incoming: Sequence[_Group],
                  own: Callable[[pa.Table], None] | None) -> Callable[[pa.Table], None]:
    """The commit's check when others landed since ``base``: the write's own (see
    :func:`_own_check`), then whether its lookups are stale."""
    buckets = {bucket for _, bucket, _ in incoming}

    def check(added: pa.Table) -> None:
        if own is not None:
            _own_check(table, base, own, added)
        hit = [b for b in added.column("bucket").to_pylist() if b in buckets]
        if hit:
            raise StaleVectors(
                f"Commits since this write's snapshot added files to buckets {sorted(set(hit))} "
                "it writes", [])

    return check


def _partition_json(values: Sequence[pa.Scalar]) -> str:
    # As the writer records it for the files of the partition (sorted_runs).
    return json.dumps([encode_partition_value(v) for v in values])


def _plan(table: TableState, view: TableView, incoming: Sequence[_Group], engine: MergeEngine,
          seq_field: str | None, *, before_images: bool = False) -> _Plan:
    """The plan of writing the ``incoming`` groups on ``view``'s snapshot. ``before_images``:
    the live rows it deletes are read (each lookup's ``deleted_rows``), for a changelog; a
    blind replace otherwise finds only where they are."""
    rec = table.record
    key = list(rec.primary_key)
    buckets = sorted({bucket for _, bucket, _ in incoming})
    live = view.metastore.live_files(rec.table_id, view.snapshot_id, buckets=buckets)
    tasks = file_tasks(view, live)
    by_group: dict[tuple[str | None, int | None], list[FileTask]] = {}
    for task in tasks:
        by_group.setdefault((task.partition_values, task.bucket), []).append(task)
    graves: dict[tuple[str | None, int | None], list[FileTask]] = {}
    if seq_field is not None:
        dead = file_tasks(view, view.metastore.live_files(
            rec.table_id, view.snapshot_id, buckets=buckets, content="tombstone"))
        for task in dead:
            graves.setdefault((task.partition_values, task.bucket), []).append(task)
        tasks = [*tasks, *dead]
    schemas = {sid: view.metastore.schema(rec.table_id, sid)
               for sid in {t.schema_id for t in tasks}}
    schema = table.schema
    plan = _Plan()
    lookup_key = lookup_columns(key, rec.partition_by)
    blind = isinstance(engine, (Deduplicate, FirstRow)) and seq_field is None
    parts = [_partition_json(values) if rec.partition_by else None for values, _, _ in incoming]
    # Every group's lookup at once: the groups' key indexes are searched in one call.
    founds = locate_many(view.storage, schemas, schema, lookup_key, [
        Lookup(by_group.get((part, bucket), []), run.select(lookup_key),
               None if blind and not (before_images and isinstance(engine, Deduplicate))
               else schema.names, (rec.location, part, bucket))
        for part, (_, bucket, run) in zip(parts, incoming, strict=True)])
    for part, (values, bucket, run), found in zip(parts, incoming, founds, strict=True):
        candidates = by_group.get((part, bucket), [])
        if blind and isinstance(engine, Deduplicate):
            _replace_blindly(plan, run, found, candidates)
        elif blind:
            _keep_first(plan, values, bucket, run, found)
        else:
            keys = run.select(lookup_key)
            buried = locate(view.storage, graves.get((part, bucket), []), schemas, schema,
                            lookup_key, keys, columns=schema.names)
            _merge_with_live(plan, values, bucket, run, found, buried,
                             [*candidates, *graves.get((part, bucket), [])], engine, key,
                             lookup_key, seq_field, list(rec.partition_by))
        plan.lookups[(part, bucket)] = found
    return plan


def _additions(run: pa.Table) -> np.ndarray:
    return ~is_retraction(row_kinds(run))


def _blind_additions(incoming: Sequence[_Group]) -> list[_Group]:
    """What a blind replace writes: each group's additions, whatever the live rows are."""
    out = []
    for values, bucket, run in incoming:
        adds = _additions(run)
        if adds.all():
            out.append((values, bucket, run.drop_columns([ROW_KIND])))
        elif adds.any():
            out.append((values, bucket, run.filter(pa.array(adds)).drop_columns([ROW_KIND])))
    return out


def _replace_blindly(plan: _Plan, run: pa.Table, found: Matches,
                     candidates: Sequence[FileTask]) -> None:
    """Delete the live rows of the written keys (their new versions are written whatever
    they were: :func:`_blind_additions`)."""
    _delete_found(plan, found, candidates)
    plan.replaced += int(_additions(run)[found.incoming].sum()) if found.count else 0


def _keep_first(plan: _Plan, values: tuple[pa.Scalar, ...], bucket: int, run: pa.Table,
                found: Matches) -> None:
    keep = _additions(run)
    keep[found.incoming] = False
    if keep.any():
        plan.groups.append((values, bucket, run.filter(pa.array(keep)).drop_columns([ROW_KIND])))


def _delete_found(plan: _Plan, found: Matches, candidates: Sequence[FileTask],
                  which: np.ndarray | None = None) -> None:
    """Mark the found rows (those ``which`` selects) deleted in their files."""
    file_ids, positions = found.file_ids, found.positions
    if which is not None:
        file_ids, positions = file_ids[which], positions[which]
    if found.slots is not None:
        found.deleted_slots.append(found.slots if which is None else found.slots[which])
    if found.rows is not None and len(file_ids):
        found.deleted_rows.append(found.rows if which is None
                                  else found.rows.filter(pa.array(which)))
    if not len(file_ids):
        return
    by_id = {t.file_id: t for t in candidates}
    # Matches come grouped by file (see locate): one slice per run of the same file.
    cuts = (np.flatnonzero(file_ids[1:] != file_ids[:-1]) + 1).tolist()
    for start, end in zip([0, *cuts], [*cuts, len(file_ids)], strict=True):
        plan.delete(by_id[int(file_ids[start])], positions[start:end])


#: The ``_seq`` of a write's own versions: newer than every committed one.
_INCOMING_SEQ = 2**62


def _snapshots_of(file_ids: np.ndarray, files: Sequence[FileTask]) -> np.ndarray:
    """The snapshot that committed each row's file (its ``_seq`` as merge-on-read orders)."""
    if not len(file_ids):
        return np.zeros(0, dtype=np.int64)
    ids = np.array([t.file_id for t in files], dtype=np.int64)
    seqs = np.array([t.seq_max or 0 for t in files], dtype=np.int64)
    order = np.argsort(ids)
    return seqs[order][np.searchsorted(ids[order], file_ids)]


def _versions(rows: pa.Table, kind: int, seqs: np.ndarray) -> pa.Table:
    return rows.append_column(ROW_KIND, pa.array(np.full(rows.num_rows, kind, np.int8))) \
        .append_column(SEQUENCE, pa.array(seqs.astype(np.int64)))


def _merge_with_live(plan: _Plan, values: tuple[pa.Scalar, ...], bucket: int, run: pa.Table,
                     found: Matches, buried: Matches, candidates: Sequence[FileTask],
                     engine: MergeEngine, key: list[str], lookup_key: list[str],
                     seq_field: str | None, partition_by: list[str]) -> None:
    """The live rows, the tombstones and the write's versions of each key merged by the
    engine, in commit order (each committed row with the snapshot of its file) as a read of
    merge-on-read runs would merge them. Keys whose result differs from their live row get
    the result written and the live row deleted; with a sequence field, keys the result
    deletes get a tombstone (the retraction that won, with its sequence value)."""
    assert found.rows is not None and buried.rows is not None
    live = found.rows
    names = live.column_names
    parts = [_versions(live, 0, _snapshots_of(found.file_ids, candidates)),
             _versions(buried.rows, 3, _snapshots_of(buried.file_ids, candidates)),
             run.select([*names, ROW_KIND]).append_column(
                 SEQUENCE, pa.array(np.full(run.num_rows, _INCOMING_SEQ, np.int64)))]
    both = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    keep_graves = seq_field is not None
    merged = engine.merge(both, key, seq_field, keep_graves, constant=partition_by)
    kinds = row_kinds(merged)
    gone_now = is_retraction(kinds)
    if keep_graves and gone_now.any():
        # Only retractions of this write need a new tombstone; older ones are recorded.
        fresh = gone_now & (merged.column(SEQUENCE).to_numpy() == _INCOMING_SEQ)
        if fresh.any():
            plan.tombstones.append((values, bucket, merged.filter(pa.array(fresh)).select(names)))
    merged = merged.filter(pa.array(~gone_now)).select(names)
    # Which merged rows replace a live row, and whether they change it.
    at_merged, at_live = match_keys(merged, live, lookup_key)
    changed = np.ones(merged.num_rows, dtype=bool)
    if len(at_merged):
        same = same_rows(live.take(pa.array(at_live)), merged.take(pa.array(at_merged)))
        changed[at_merged[same]] = False
    gone = np.ones(live.num_rows, dtype=bool)  # live rows replaced or deleted
    gone[at_live[~changed[at_merged]]] = False
    if changed.any():
        plan.groups.append((values, bucket, merged.filter(pa.array(changed))))
    _delete_found(plan, found, candidates, gone)
    plan.replaced += int(changed[at_merged].sum())


def _write(table: TableState, groups: Iterable[_Group], during: Callable[[], _T] | None = None
           ) -> tuple[_Written, _T | None]:
    """The new rows of every group as one file in its partition's bucket (table schema, no
    row-kind column: every row of a merge-on-write file is live until a vector says not);
    ``during`` is called while the write pool writes them, and what it returns is returned
    with the files. The new files' keys go to this process's lookup cache."""

    def start(writers: list[DataFileWriter]
              ) -> tuple[list[tuple[DataFileWriter, pa.Table]], _T | None]:
        started = start_group_writers(table, groups, table.schema, writers)
        return started, (during() if during is not None else None)

    files, (started, result) = write_started(start)
    # Kept decoded when the table keeps runs (by default on ``lookup`` tables), so that the
    # before-images of the next writes are taken from memory (see rows_at).
    remember_runs(table, started)
    rec = table.record
    images = remember_written(table.storage, rec.location, started, table.schema,
                              lookup_columns(rec.primary_key, rec.partition_by))
    return _Written(files, images), result


@dataclass
class _Written:
    """A write's new files, and per group the sorted key images of its files (by path)."""

    files: list[NewFile]
    images: Written = field(default_factory=dict)


def _advance_indexes(table: TableState, plan: _Plan, written: _Written,
                     vectors: Sequence[NewVector]) -> None:
    """After the commit of ``plan``: each group's key index as the commit left the group (its
    deleted rows out, its new files' keys in), for the next write of this process; all groups
    in one call (in parallel, without the GIL, on the native path)."""
    rec = table.record
    key = lookup_columns(rec.primary_key, rec.partition_by)
    grown = {plan.tasks[v.file_id].path: v.cardinality for v in vectors}
    names, steps = [], []
    for (part, bucket), found in plan.lookups.items():
        index = found.index
        name = index_group((rec.location, part, bucket), table.schema, key)
        added = written.images.get((part, bucket), [])
        if index is None or any(image is None for _, image in added):
            key_index.keep(name, None)
            continue
        state = frozenset([*((path, grown.get(path, card)) for path, card in index.state),
                           *((path, 0) for path, _ in added)])
        removed = (np.concatenate(found.deleted_slots) if found.deleted_slots
                   else np.zeros(0, dtype=np.int64))
        names.append(name)
        steps.append((index, removed,
                      [(path, image) for path, image in added if image is not None], state))
    for name, advanced in zip(names, key_index.advance_many(steps), strict=True):
        key_index.keep(name, advanced)


def _vectors(table: TableState, plan: _Plan) -> tuple[list[NewVector], str | None]:
    """Each touched file's new cumulative vector (its old positions and the new ones); vectors
    over :data:`~arrowlake.io.deletion_vectors.INLINE_LIMIT` bytes go in one Puffin file."""
    storage = table.storage
    touched = [(fid, plan.tasks[fid]) for fid in plan.deletes]
    # All files' vectors in one call (in parallel, without the GIL, on the native path).
    encoded = dv.extend_many(storage, [
        (np.concatenate(plan.deletes[fid]), task.deletes, task.path) for fid, task in touched])
    out: list[tuple[int, int, int, int | None, bytes]] = []
    for (fid, task), (blob, card) in zip(touched, encoded, strict=True):
        before = task.deletes.cardinality if task.deletes is not None else 0
        previous = task.deletes.since if task.deletes is not None else None
        out.append((fid, card, card - before, previous, blob))
    large = [o for o in out if len(o[4]) > dv.INLINE_LIMIT]
    relative = None
    locations: dict[int, puffin.BlobLocation] = {}
    if large:
        relative = f"vectors/{new_file_name('puffin')}"
        path = storage.join(table.record.location, relative)
        written = puffin.write_puffin(storage, path, [
            puffin.Blob(blob, dv.BLOB_TYPE, {"referenced-data-file": plan.tasks[fid].path,
                                             "cardinality": str(card)})
            for fid, card, _, _, blob in large])
        locations = {o[0]: loc for o, loc in zip(large, written, strict=True)}
    vectors = []
    for fid, card, new, previous, blob in out:
        at = locations.get(fid)
        if at is None:
            vectors.append(NewVector(fid, card, new, previous, blob=blob))
        else:
            vectors.append(NewVector(fid, card, new, previous, puffin_path=relative,
                                     blob_offset=at.offset, blob_length=at.length))
    return vectors, relative


def _lookup_changelog(table: TableState, plan: _Plan) -> list[NewFile]:
    """The ``lookup`` producer's changelog files of ``plan``, one per group: the live rows it
    deletes there and the rows it writes there, labelled by key as streams label a snapshot's
    vectors and new files (:func:`~arrowlake.table.changelogs.files.labelled_change`), so a
    stream of the snapshot reads these instead of decoding the old rows from their files."""
    rec, schema = table.record, table.schema
    after: dict[tuple[str | None, int], tuple[tuple[pa.Scalar, ...], list[pa.Table]]] = {}
    for values, bucket, rows in plan.groups:
        group = (_partition_json(values) if rec.partition_by else None, bucket)
        after.setdefault(group, (values, []))[1].append(rows.select(schema.names).cast(schema))
    values_of = {g: v for g, (v, _) in after.items()}
    retracted = {g: found.deleted_rows for g, found in plan.lookups.items()
                 if found.deleted_rows}
    for group, rows in retracted.items():
        if group not in values_of:
            # A group that only deletes: its partition values as its retracted rows hold them.
            values_of[group] = tuple(rows[0].column(c)[0] for c in rec.partition_by)
    parts: list[Part] = []
    for group, values in values_of.items():
        before = retracted.get(group, [])
        rows = labelled_change(
            pa.concat_tables([r.cast(schema) for r in before]) if before
            else schema.empty_table(),
            pa.concat_tables(after[group][1]) if group in after else schema.empty_table(),
            rec.primary_key)
        if rows.num_rows:
            shown = [partition_shown(v) for v in values]
            parts.append((partition_path(rec.partition_by, shown) if rec.partition_by else None,
                          group[0], group[1], rows))
    return write_parts(table, parts) if parts else []


def _forget(table: TableState, relative: str | None) -> None:
    """Delete a Puffin file written for a commit that did not happen."""
    if relative is not None:
        table.discard([NewFile(relative, 0, 0, 0)])


__all__ = ["OnWriteChange", "on_write_change", "write_tombstones"]
