"""Commits: one database transaction that checks for conflicts, rebases where it may, and
records a snapshot and its files; lost races are retried, lost replies are recognized by
the write token."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from arrowlake.errors import CommitConflict
from arrowlake.metastore import signals
from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.inflight import CURRENT_WRITE, InflightWrites
from arrowlake.metastore.records import (
    DELETION_VECTORS_PROPERTY,
    FILE_COLUMNS,
    FILE_SCHEMA,
    CommitResult,
    NewFile,
    NewVector,
    PartitionIds,
    SnapshotChange,
    StaleVectors,
    TableConflict,
    VectorRecord,
    check_commit_id,
    deletion_vectors_on,
    now_ms,
    partition_alias,
    rows_to_table,
    same_nulls,
    vector_bytes,
)
from arrowlake.metastore.snapshot_cache import SnapshotCache

_T = TypeVar("_T")
#: A snapshot cache entry to keep once a commit lands: key, value, rows, bytes.
_Seed = tuple[Hashable, Any, int, int]


def live_file_columns() -> list[Any]:
    """``al_files``' columns of :data:`FILE_SCHEMA` as a snapshot reads them: none of its live
    files is removed as of it."""
    c = t.files.c
    return [sa.null().label(n) if n == "removed_snapshot" else c[n] for n in FILE_COLUMNS]


class Commits(Database):
    """The commit path of :class:`~arrowlake.metastore.store.Metastore`."""

    snapshot_cache: SnapshotCache

    def files_added_between(self, conn: Connection | None, table_id: int, after: int | None,
                            upto: int) -> pa.Table:
        """Data and tombstone files added by snapshots in ``(after, upto]``, removed since or
        not."""
        c = t.files.c
        query = sa.select(*[c[n] for n in FILE_COLUMNS]).where(
            (c.table_id == table_id) & (c.added_snapshot <= upto)
            & c.content.in_(("data", "tombstone")))
        if after is not None:
            query = query.where(c.added_snapshot > after)
        if conn is None:
            with self._read() as own:
                rows = own.execute(query.order_by(c.file_id)).all()
        else:
            rows = conn.execute(query.order_by(c.file_id)).all()
        return rows_to_table(rows, FILE_SCHEMA)

    # -- commits -------------------------------------------------------------------------------

    def commit(self, table_id: int, base_snapshot_id: int | None,
               change: SnapshotChange) -> CommitResult:
        """Record ``change`` as the table's next snapshot, atomically.

        Runs one transaction: if other commits landed after ``base_snapshot_id``, the change is
        rebased (``on_rebase`` decides whether that is allowed); files to remove must still be
        live, else :class:`CommitConflict`; then the snapshot row, its file rows and the table's
        current snapshot are written. A lost race (two writers taking the same snapshot id) is
        detected by the snapshots primary key and the compare-and-set on ``al_tables``, and
        retried with backoff.

        Every call records a random write token with its snapshot. An OperationalError can come
        after the database committed (the reply to COMMIT was lost), so a retry first looks for
        its own token and, when that attempt landed, returns its snapshot instead of committing
        the change a second time. A table dropped meanwhile raises :class:`TableNotFound`, a
        read-only database :class:`ReadOnlyLake`; neither is retried.
        """
        check_commit_id(change.commit_id)
        current_write = CURRENT_WRITE.get()
        result = self._committing(table_id, lambda conn, token, retrying, seeds:
                                  self._commit_once(conn, table_id, base_snapshot_id, change,
                                                    token, retrying, current_write, seeds))
        assert result is not None
        return result

    def commit_holding(self, table_id: int,
                       prepare: Callable[[int | None], SnapshotChange | None]
                       ) -> CommitResult | None:
        """Commit the change ``prepare`` plans on the table's current snapshot (given to it),
        holding the table meanwhile: its row is locked (SQLite: the write lock), so no other
        commit lands between the plan and the commit. For a writer that others keep
        overtaking: it waits for its turn instead of planning again after each of theirs.
        ``prepare`` reads through the metastore's other connections (which see the current
        state, since nothing else commits) and may be called again when the database asks for
        a retry. None when it finds nothing to commit."""

        def once(conn: Connection, token: str, retrying: bool, seeds: list[_Seed]
                 ) -> tuple[int, bool] | None:
            row = conn.execute(sa.select(t.tables.c.current_snapshot_id).where(
                t.tables.c.table_id == table_id).with_for_update()).first()
            if row is None:
                raise self._dropped(table_id)
            current = None if row[0] is None else int(row[0])
            change = prepare(current)
            if change is None:
                return None
            check_commit_id(change.commit_id)
            return self._commit_once(conn, table_id, current, change, token, retrying,
                                     current_write, seeds)

        current_write = CURRENT_WRITE.get()

        return self._committing(table_id, once)

    def commit_many(self, entries: Sequence[tuple[int, int | None, SnapshotChange]], *,
                    transaction_id: str, commit_id: str | None = None
                    ) -> list[CommitResult]:
        """Record the changes of several tables as one database transaction: every table's
        next snapshot, or none. ``entries`` are (table id, base snapshot, change), at most one
        per table; each change is checked and rebased by the rules of :meth:`commit`, and a
        failing one raises :class:`TableConflict` naming its table (nothing is kept). Every
        snapshot records ``transaction_id``.

        ``commit_id`` makes the whole transaction idempotent: recorded on each of its
        snapshots, and when any table already holds it, nothing is committed and every result
        is a duplicate (the snapshot holding it, or None for a table it did not write).
        Lost races and transient errors are retried as for one table; a retry first looks for
        the transaction's own snapshots, in case the reply to an earlier COMMIT was lost.
        """
        check_commit_id(commit_id)
        tables = [table_id for table_id, _, _ in entries]
        if len(set(tables)) != len(tables):
            raise ValueError("a lake transaction commits at most one change per table")
        order = sorted(range(len(entries)), key=lambda i: entries[i][0])  # lock in one order
        tokens = [uuid.uuid4().hex for _ in entries]
        changes = [replace(change, commit_id=commit_id, transaction_id=transaction_id)
                   for _, _, change in entries]
        for change in changes:
            check_commit_id(change.commit_id)
        current_write = CURRENT_WRITE.get()

        def once(attempts: int) -> list[CommitResult]:
            seeds: list[_Seed] = []
            with self._write() as conn:
                if attempts > 1:
                    mine = self._landed(tables[0], tokens[0], conn)
                    if mine is not None:
                        return [CommitResult(self._landed(t, tok, conn), attempts)
                                for t, tok in zip(tables, tokens, strict=True)]
                if commit_id is not None:
                    found = self._transaction_duplicates(conn, tables, commit_id)
                    if any(f is not None for f in found):
                        return [CommitResult(f, attempts, True) for f in found]
                results: list[tuple[int, bool] | None] = [None] * len(entries)
                for i in order:
                    table_id, base, _ = entries[i]
                    try:
                        results[i] = self._commit_once(conn, table_id, base, changes[i],
                                                       tokens[i], False, current_write, seeds)
                    except CommitConflict as exc:
                        raise TableConflict(table_id, exc) from exc
                self._notify(conn, tables)
            self._seed(seeds)
            for table_id in tables:
                signals.publish(self.url, table_id)
            return [CommitResult(r[0], attempts) for r in results if r is not None]

        def landed(attempts: int) -> list[CommitResult] | None:
            if self._landed(tables[0], tokens[0]) is None:
                return None
            return [CommitResult(self._landed(t, tok), attempts)
                    for t, tok in zip(tables, tokens, strict=True)]

        return self._retrying(once, landed, f"a transaction of {len(tables)} tables")

    @staticmethod
    def _transaction_duplicates(conn: Connection, tables: Sequence[int], commit_id: str
                                ) -> list[int | None]:
        s = t.snapshots.c
        found = dict(conn.execute(sa.select(s.table_id, s.snapshot_id).where(
            s.table_id.in_(list(tables)) & (s.commit_id == commit_id))).all())
        return [None if found.get(tid) is None else int(found[tid]) for tid in tables]

    def _committing(self, table_id: int,
                    once: Callable[[Connection, str, bool, list[_Seed]],
                                   tuple[int, bool] | None]
                    ) -> CommitResult | None:
        """Run ``once`` (one commit attempt in a write transaction) until it lands or fails for
        good: lost races and transient database errors are retried with backoff."""
        token = uuid.uuid4().hex

        def attempt(attempts: int) -> CommitResult | None:
            seeds: list[_Seed] = []
            with self._write() as conn:
                result = once(conn, token, attempts > 1, seeds)
                if result is None:
                    return None
                if not result[1]:
                    self._notify(conn, [table_id])
            self._seed(seeds)
            if not result[1]:
                signals.publish(self.url, table_id)
            return CommitResult(result[0], attempts, result[1])

        def landed(attempts: int) -> CommitResult | None:
            snapshot = self._landed(table_id, token)
            return None if snapshot is None else CommitResult(snapshot, attempts)

        return self._retrying(attempt, landed, f"to table {table_id}")

    def _notify(self, conn: Connection, table_ids: Sequence[int]) -> None:
        """On PostgreSQL, tell streams in every process (signals.listen) that these tables
        moved: delivered at COMMIT."""
        if self.dialect == "postgresql":
            for table_id in table_ids:
                conn.execute(sa.select(sa.func.pg_notify(signals.CHANNEL, str(table_id))))

    def _retrying(self, once: Callable[[int], _T], landed: Callable[[int], _T | None],
                  what: str) -> _T:
        """``once(attempt)`` (one commit attempt in a write transaction) until it returns or
        fails for good: lost races and transient database errors are retried with jittered
        backoff; once retries run out, ``landed(attempts)`` tells whether an attempt whose
        reply was lost committed after all."""
        attempts = 0
        while True:
            attempts += 1
            try:
                return once(attempts)
            except CommitConflict:
                raise
            except (DBAPIError, _LostRace) as exc:
                retryable = isinstance(exc, (IntegrityError, OperationalError, _LostRace)) or (
                    isinstance(exc, DBAPIError) and exc.connection_invalidated)
                if not retryable:
                    raise
                if attempts >= self.commit_retries:
                    got = landed(attempts)
                    if got is not None:
                        return got
                    raise CommitConflict(
                        f"Gave up committing {what} after {attempts} attempts: {exc}") from exc
                time.sleep(min(0.5, 0.002 * 2 ** min(attempts, 8)) * random.random())

    def _landed(self, table_id: int, token: str, conn: Connection | None = None) -> int | None:
        """The snapshot an attempt with ``token`` committed, if one did."""
        query = sa.select(t.snapshots.c.snapshot_id).where(
            (t.snapshots.c.table_id == table_id) & (t.snapshots.c.write_token == token))
        if conn is None:
            with self._read() as own:
                row = own.execute(query).first()
        else:
            row = conn.execute(query).first()
        return None if row is None else int(row[0])

    def _commit_once(self, conn: Connection, table_id: int, base: int | None,
                     change: SnapshotChange, token: str | None = None,
                     retrying: bool = False, write_id: str | None = None,
                     seeds: list[_Seed] | None = None) -> tuple[int, bool]:
        """One attempt at committing ``change`` in transaction ``conn``: ``(snapshot id,
        whether it is a duplicate)``. ``seeds`` receives what the snapshot cache can hold of
        the new snapshot once the transaction commits (see :meth:`_seed`)."""
        tbl = t.tables.c
        # The row lock also waits out an earlier attempt of this commit that the database may
        # still be finishing, so the token lookup below sees whether it landed.
        row = conn.execute(sa.select(tbl.current_snapshot_id, tbl.last_snapshot_id,
                                     tbl.properties, tbl.next_row_id).where(
            tbl.table_id == table_id).with_for_update()).first()
        if row is None:
            raise self._dropped(table_id)
        current, last, first_row_id = row[0], int(row[1]), int(row[3])
        if retrying and token is not None:
            mine = self._landed(table_id, token, conn)
            if mine is not None:
                return mine, False
        if change.commit_id is not None:
            dup = conn.execute(sa.select(t.snapshots.c.snapshot_id).where(
                (t.snapshots.c.table_id == table_id)
                & (t.snapshots.c.commit_id == change.commit_id))).first()
            if dup is not None:
                return int(dup[0]), True
        if change.add or change.changelog or change.tombstones or change.vectors:
            for registered in {*change.write_ids, *([write_id] if write_id else [])}:
                InflightWrites.check_registered(conn, registered)
        if change.deletion_vectors is not None and \
                deletion_vectors_on(json.loads(row[2])) != change.deletion_vectors:
            planned = "deletion vectors" if change.deletion_vectors else "merge-on-read runs"
            raise CommitConflict(
                f"The table's mode was switched while this {change.kind} was planned for "
                f"{planned} (property '{DELETION_VECTORS_PROPERTY}' changed); nothing was "
                f"committed and the table is unchanged. Retry the {change.kind}: it is planned "
                "in the table's new mode")
        if current != base and change.on_rebase is not None and current is not None:
            change.on_rebase(self.files_added_between(conn, table_id, base, current))
        new_id = last + 1
        if change.expect_vectors:
            self._check_vectors(conn, table_id, change.expect_vectors)
        if change.remove:
            # Only files that were live in the base snapshot the change was planned on: a file
            # committed after it is never one the plan read, whatever its id.
            res = conn.execute(
                t.files.update()
                .where((t.files.c.table_id == table_id)
                       & t.files.c.file_id.in_(list(change.remove))
                       & (t.files.c.added_snapshot <= (-1 if base is None else base))
                       & t.files.c.removed_snapshot.is_(None))
                .values(removed_snapshot=new_id))
            if res.rowcount != len(change.remove):
                raise CommitConflict(
                    f"Another commit removed {len(change.remove) - res.rowcount} of the files "
                    f"this {change.kind} read; the table is unchanged. Retry the {change.kind} "
                    "on the current snapshot.")
        if change.remove:
            # A removed file's vector ends with it (its rows are gone, or live on elsewhere).
            conn.execute(t.vectors.update().where(
                (t.vectors.c.table_id == table_id)
                & t.vectors.c.file_id.in_(list(change.remove))
                & t.vectors.c.removed_snapshot.is_(None)).values(removed_snapshot=new_id))
        if change.remove_tombstones:
            conn.execute(t.files.update().where(
                (t.files.c.table_id == table_id) & (t.files.c.content == "tombstone")
                & t.files.c.file_id.in_(list(change.remove_tombstones))
                & t.files.c.removed_snapshot.is_(None)).values(removed_snapshot=new_id))
        if change.vectors:
            self._record_vectors(conn, table_id, new_id, change.vectors)
        partition_ids = self._partition_ids(conn, table_id, [*change.add, *change.changelog,
                                                             *change.tombstones])
        if change.add:
            # Row lineage: each data file's rows take the next ids, in the order added.
            starts = [first_row_id]
            for f in change.add:
                starts.append(starts[-1] + f.row_count)
            conn.execute(t.files.insert(), [
                dict(table_id=table_id, path=f.path, first_row_id=start,
                     partition_id=partition_ids.get(
                    f.partition_path), bucket=f.bucket, added_snapshot=new_id,
                    removed_snapshot=None, schema_id=f.schema_id, row_count=f.row_count,
                    file_size=f.file_size, content=f.content, stats=f.stats, key_min=f.key_min,
                    key_max=f.key_max,
                    # A new run's versions are ordered by the snapshot that commits them;
                    # compaction output keeps the sequence range of its inputs.
                    seq_min=new_id if f.seq_min is None else f.seq_min,
                    seq_max=new_id if f.seq_max is None else f.seq_max)
                for f, start in zip(change.add, starts, strict=False)])
        if change.tombstones:
            conn.execute(t.files.insert(), [
                dict(table_id=table_id, path=f.path, partition_id=partition_ids.get(
                    f.partition_path), bucket=f.bucket, added_snapshot=new_id,
                    removed_snapshot=None, schema_id=f.schema_id, row_count=f.row_count,
                    file_size=f.file_size, content="tombstone", stats=f.stats,
                    key_min=f.key_min, key_max=f.key_max, seq_min=new_id, seq_max=new_id)
                for f in change.tombstones])
        if change.changelog:
            conn.execute(t.files.insert(), [
                dict(table_id=table_id, path=f.path, partition_id=partition_ids.get(
                    f.partition_path), bucket=f.bucket, added_snapshot=new_id,
                    removed_snapshot=new_id + 1, schema_id=f.schema_id, row_count=f.row_count,
                    file_size=f.file_size, content="changelog", stats=f.stats,
                    key_min=f.key_min, key_max=f.key_max, seq_min=new_id, seq_max=new_id)
                for f in change.changelog])
        totals = (0, 0)
        committed_at = now_ms()
        if current is not None:
            s = t.snapshots.c
            prev = conn.execute(sa.select(s.total_files, s.total_rows, s.committed_at)
                                .where((s.table_id == table_id)
                                       & (s.snapshot_id == current))).first()
            if prev is not None:
                totals = (int(prev[0]), int(prev[1]))
                # Commit times never go backwards along the chain, even when writers' clocks
                # disagree: time travel relies on it.
                committed_at = max(committed_at, int(prev[2]))
            conn.execute(t.snapshots.update().where(
                (s.table_id == table_id) & (s.snapshot_id == current)
            ).values(superseded_at=committed_at))
        added_rows = sum(f.row_count for f in change.add)
        conn.execute(t.snapshots.insert().values(
            table_id=table_id, snapshot_id=new_id, parent_id=current, kind=change.kind,
            committed_at=committed_at, schema_id=change.schema_id, commit_id=change.commit_id,
            write_token=token, first_row_id=first_row_id,
            transaction_id=change.transaction_id,
            added_files=len(change.add), removed_files=len(change.remove),
            added_rows=added_rows, removed_rows=change.removed_rows,
            total_files=totals[0] + len(change.add) - len(change.remove),
            total_rows=totals[1] + added_rows - change.removed_rows,
            summary=json.dumps(change.summary)))
        res = conn.execute(t.tables.update().where(
            (tbl.table_id == table_id) & (tbl.last_snapshot_id == last)
        ).values(current_snapshot_id=new_id, last_snapshot_id=new_id,
                 next_row_id=first_row_id + added_rows))
        if res.rowcount != 1:
            raise _LostRace(f"another writer committed snapshot {new_id} first")
        if seeds is not None:
            seeds.extend(self._derived_entries(conn, table_id, current, new_id, change))
        return new_id, False

    def _derived_entries(self, conn: Connection, table_id: int, parent: int | None,
                         new_id: int, change: SnapshotChange) -> list[_Seed]:
        """The snapshot cache's entries of ``new_id`` (its live data files and vectors), derived
        from those of its ``parent`` (when the cache holds them) and what ``change`` recorded,
        so that the next write's plan costs no query for them. Only the new file rows are read,
        inside the commit's transaction (their ids come from the database)."""
        cache = self.snapshot_cache
        files: pa.Table | None = FILE_SCHEMA.empty_table() if parent is None else \
            cache.get(("files", table_id, parent, "data"))
        vectors: Mapping[int, VectorRecord] | None = {} if parent is None else \
            cache.get(("vectors", table_id, parent))
        out: list[_Seed] = []
        removed = list(change.remove)
        if files is not None:
            if removed:
                files = files.filter(pc.invert(pc.is_in(
                    files.column("file_id"), value_set=pa.array(removed, pa.int64()))))
            if any(f.content == "data" for f in change.add):
                c = t.files.c
                rows = conn.execute(sa.select(*live_file_columns()).where(
                    (c.table_id == table_id) & (c.added_snapshot == new_id)
                    & (c.content == "data"))).all()
                files = pa.concat_tables([files, rows_to_table(rows, FILE_SCHEMA)])
                files = files.take(pc.sort_indices(files.column("file_id")))
            out.append((("files", table_id, new_id, "data"), files, files.num_rows,
                        files.nbytes))
        if vectors is not None:
            records = dict(vectors)
            for file_id in removed:
                records.pop(file_id, None)
            for x in change.vectors:
                records[x.file_id] = VectorRecord(x.file_id, new_id, x.cardinality, x.blob,
                                                  x.puffin_path, x.blob_offset, x.blob_length)
            out.append((("vectors", table_id, new_id), MappingProxyType(records),
                        len(records), vector_bytes(records.values())))
        return out

    def _seed(self, seeds: Sequence[_Seed]) -> None:
        """Keep the entries :meth:`_derived_entries` gave, once their commit landed."""
        for key, value, rows, nbytes in seeds:
            self.snapshot_cache.put(key, value, rows, nbytes)

    @staticmethod
    def _current_vectors(conn: Connection, table_id: int, file_ids: Sequence[int]
                         ) -> dict[int, int]:
        """The snapshot that recorded each file's current vector (files without one absent)."""
        v = t.vectors.c
        current: dict[int, int] = {}
        for start in range(0, len(file_ids), 500):
            current.update((int(r[0]), int(r[1])) for r in conn.execute(
                sa.select(v.file_id, v.added_snapshot).where(
                    (v.table_id == table_id) & v.file_id.in_(list(file_ids[start:start + 500]))
                    & v.removed_snapshot.is_(None))))
        return current

    def _check_vectors(self, conn: Connection, table_id: int,
                       expected: Mapping[int, int | None]) -> None:
        current = self._current_vectors(conn, table_id, list(expected))
        stale = [fid for fid, since in expected.items() if current.get(fid) != since]
        if stale:
            raise StaleVectors(
                f"Another commit marked rows of {len(stale)} of the files this rewrite read "
                "deleted meanwhile", stale)

    def _record_vectors(self, conn: Connection, table_id: int, new_id: int,
                        vectors: Sequence[NewVector]) -> None:
        """Replace each file's current vector by its new one, if the file is still live and
        its current vector is still the one the new one extends; else :class:`StaleVectors`
        (nothing of this commit is kept: the transaction rolls back)."""
        f, v = t.files.c, t.vectors.c
        ids = [x.file_id for x in vectors]
        live: set[int] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            live.update(int(r[0]) for r in conn.execute(sa.select(f.file_id).where(
                (f.table_id == table_id) & f.file_id.in_(chunk) & f.removed_snapshot.is_(None))))
        current = self._current_vectors(conn, table_id, ids)
        stale = [x.file_id for x in vectors
                 if x.file_id not in live or current.get(x.file_id) != x.previous]
        if stale:
            raise StaleVectors(
                f"{len(stale)} data files whose rows this commit marks deleted were removed or "
                "had rows marked deleted by another commit meanwhile", stale)
        replaced = [x.file_id for x in vectors if x.previous is not None]
        for start in range(0, len(replaced), 500):
            conn.execute(t.vectors.update().where(
                (v.table_id == table_id) & v.file_id.in_(replaced[start:start + 500])
                & v.removed_snapshot.is_(None)).values(removed_snapshot=new_id))
        conn.execute(t.vectors.insert(), [
            dict(table_id=table_id, file_id=x.file_id, added_snapshot=new_id,
                 removed_snapshot=None, cardinality=x.cardinality, blob=x.blob,
                 puffin_path=x.puffin_path, blob_offset=x.blob_offset,
                 blob_length=x.blob_length)
            for x in vectors])

    def _partition_ids(self, conn: Connection, table_id: int,
                       add: Sequence[NewFile]) -> dict[str | None, int | None]:
        wanted = {f.partition_path: f.partition_values for f in add if f.partition_path is not None}
        ids: dict[str | None, int | None] = {None: None}
        if not wanted:
            return ids
        c = t.partitions.c
        rows: set[tuple[int, str, str]] = set()

        def load(column: sa.ColumnElement[str], keys: list[str]) -> PartitionIds:
            for start in range(0, len(keys), 500):
                rows.update((int(pid), path, values) for pid, path, values in conn.execute(
                    sa.select(c.partition_id, c.path, c.partition_values).where(
                        (c.table_id == table_id) & column.in_(keys[start:start + 500]))))
            return PartitionIds.of(list(rows))

        # The partitions at these paths; then, for the paths they do not settle (see
        # PartitionIds: a new path, or one holding other values), those of the same values.
        known = load(c.path, list(wanted))
        unsettled = sorted({v for p, v in wanted.items() if v and not (
            p in known.by_path and same_nulls(known.by_path[p][1], v))})
        if unsettled:
            known = load(c.partition_values, unsettled)
        for path, values in wanted.items():
            pid = known.get(path, values)
            if pid is None:
                # The path is taken only by a partition of other values: record an alias.
                record_path = path if path not in known.by_path else partition_alias(
                    path, values or "")
                pid = int(conn.execute(t.partitions.insert().values(
                    table_id=table_id, path=record_path, partition_values=values
                )).inserted_primary_key[0])  # type: ignore[index]
                known.by_values[values or ""] = pid
            ids[path] = pid
        return ids


class _LostRace(Exception):
    pass
