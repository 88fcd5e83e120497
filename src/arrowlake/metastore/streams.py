"""What streams ask the metastore: snapshots after a position, the files a range of
snapshots added and removed, and consumers' persisted progress."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from arrowlake.errors import ConsumerInUse
from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.records import (
    FILE_COLUMNS,
    FILE_SCHEMA,
    check_name,
    now_ms,
    rows_to_table,
)


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a consumer's lease: a token unique to one open stream, and where it runs
    (``host`` names the machine and PID namespace, so that a holder's process id can be
    checked there)."""

    token: str
    host: str
    pid: int


class Streams(Database):
    """The stream and consumer queries of :class:`~arrowlake.metastore.store.Metastore`."""

    # -- streams -------------------------------------------------------------------------------

    _STREAM_SNAPSHOT_COLUMNS = ("snapshot_id", "parent_id", "kind", "committed_at",
                                "schema_id", "added_files", "removed_files", "summary",
                                "transaction_id")

    def snapshots_after(self, table_id: int, after: int | None, limit: int = 1000,
                        upto: int | None = None) -> list[dict[str, Any]]:
        """Retained snapshots with ids in ``(after, upto]``, oldest first, at most ``limit``.

        One range scan of the snapshots' primary key: what a stream's poll costs. Snapshot ids
        become visible in commit order (commits of one table are serialized by its row lock),
        so a poll never sees a snapshot before an older one.
        """
        s = t.snapshots.c
        query = sa.select(*[s[c] for c in self._STREAM_SNAPSHOT_COLUMNS]).where(
            s.table_id == table_id)
        if after is not None:
            query = query.where(s.snapshot_id > after)
        if upto is not None:
            query = query.where(s.snapshot_id <= upto)
        with self._read() as conn:
            rows = conn.execute(query.order_by(s.snapshot_id).limit(limit)).all()
            if not rows and conn.execute(sa.select(t.tables.c.table_id).where(
                    t.tables.c.table_id == table_id)).first() is None:
                # A dropped table has no snapshots: tell that apart from "nothing new".
                raise self._dropped(table_id)
        return [dict(r._mapping) for r in rows]

    def earliest_snapshot_id(self, table_id: int) -> int | None:
        with self._read() as conn:
            value = conn.execute(sa.select(sa.func.min(t.snapshots.c.snapshot_id)).where(
                t.snapshots.c.table_id == table_id)).scalar_one()
        return None if value is None else int(value)

    def files_changed(self, table_id: int, after: int, upto: int) -> tuple[pa.Table, pa.Table]:
        """Files added (data and changelog files: see ``content``), and data files removed, by
        the snapshots in ``(after, upto]`` (two indexed range queries)."""
        c = t.files.c
        cols = [c[n] for n in FILE_COLUMNS]
        in_table = c.table_id == table_id
        with self._read() as conn:
            added = conn.execute(sa.select(*cols).where(
                in_table & (c.added_snapshot > after) & (c.added_snapshot <= upto))
                .order_by(c.file_id)).all()
            removed = conn.execute(sa.select(*cols).where(
                in_table & (c.removed_snapshot > after) & (c.removed_snapshot <= upto)
                & (c.content == "data")).order_by(c.file_id)).all()
        return rows_to_table(added, FILE_SCHEMA), rows_to_table(removed, FILE_SCHEMA)

    def consumer_next_snapshot(self, table_id: int, consumer_id: str) -> int | None:
        """Where consumer ``consumer_id`` resumes (its first unprocessed snapshot), or None."""
        c = t.consumers.c
        with self._read() as conn:
            row = conn.execute(sa.select(c.next_snapshot).where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id))).first()
        return None if row is None else int(row[0])

    def commit_consumer(self, table_id: int, consumer_id: str, next_snapshot: int,
                        holder: LeaseHolder | None = None, lease_ms: int | None = None) -> int:
        """Record, in one transaction, that ``consumer_id`` resumes at ``next_snapshot``, unless
        it already resumes later (progress never moves backwards); the position it resumes at
        now. With ``holder``: refused with ConsumerInUse when another holder has the consumer's
        lease, and with ``lease_ms`` the holder's lease is renewed for that long."""
        check_name("consumer", consumer_id)
        c = t.consumers.c
        with self._write() as conn:
            self._lock_table(conn, table_id)
            now = now_ms()
            if holder is not None:
                self._check_lease(conn, table_id, consumer_id, holder, now, lease_ms)
            where = (c.table_id == table_id) & (c.consumer_id == consumer_id)
            recorded = conn.execute(sa.select(c.next_snapshot).where(where)).scalar()
            if recorded is not None:
                # The table row lock serializes this with every other consumer commit of the
                # table, so the comparison and the update see the same row.
                next_snapshot = max(int(recorded), next_snapshot)
                conn.execute(t.consumers.update().where(where).values(
                    next_snapshot=next_snapshot, committed_at=now))
            else:
                conn.execute(t.consumers.insert().values(
                    table_id=table_id, consumer_id=consumer_id, next_snapshot=next_snapshot,
                    committed_at=now))
        return next_snapshot

    # -- leases: one open stream per consumer id -------------------------------------------------

    def acquire_consumer_lease(self, table_id: int, consumer_id: str, holder: LeaseHolder,
                               lease_ms: int, alive: Any) -> None:
        """Make ``holder`` the one holder of the consumer id for ``lease_ms``, or raise
        ConsumerInUse while another holder's lease runs. ``alive(lease_row)`` says whether a
        lease row's holder is known to be alive or dead (True/False), or cannot tell (None):
        the lease of a holder known dead is taken over at once, of one known alive never."""
        check_name("consumer", consumer_id)
        c = t.consumer_leases.c
        where = (c.table_id == table_id) & (c.consumer_id == consumer_id)
        with self._write() as conn:
            self._lock_table(conn, table_id)
            now = now_ms()
            row = conn.execute(sa.select(t.consumer_leases).where(where)).first()
            values = {"holder": holder.token, "host": holder.host, "pid": holder.pid,
                      "expires_at": now + lease_ms}
            if row is None:
                conn.execute(t.consumer_leases.insert().values(
                    table_id=table_id, consumer_id=consumer_id, **values))
                return
            if row.holder != holder.token:
                state = alive(row)
                if state or (state is None and row.expires_at > now):
                    raise self._in_use(consumer_id, row, now, known_alive=bool(state))
            conn.execute(t.consumer_leases.update().where(where).values(**values))

    def renew_consumer_lease(self, table_id: int, consumer_id: str, holder: LeaseHolder,
                             lease_ms: int) -> None:
        """Extend ``holder``'s lease; ConsumerInUse when another holder took it over."""
        with self._write() as conn:
            self._lock_table(conn, table_id)
            self._check_lease(conn, table_id, consumer_id, holder, now_ms(), lease_ms)

    def release_consumer_lease(self, table_id: int, consumer_id: str, holder: LeaseHolder
                               ) -> None:
        """Give up ``holder``'s lease (nothing when another holder has it by now)."""
        c = t.consumer_leases.c
        with self._write() as conn:
            conn.execute(t.consumer_leases.delete().where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id)
                & (c.holder == holder.token)))

    def _check_lease(self, conn: Connection, table_id: int, consumer_id: str,
                     holder: LeaseHolder, now: int, lease_ms: int | None) -> None:
        """Within a write transaction holding the table's row lock: raise ConsumerInUse when
        another holder has the lease (even expired: ``holder`` was superseded); else, with
        ``lease_ms``, renew ``holder``'s lease (taking it again if it was released)."""
        c = t.consumer_leases.c
        where = (c.table_id == table_id) & (c.consumer_id == consumer_id)
        row = conn.execute(sa.select(t.consumer_leases).where(where)).first()
        if row is not None and row.holder != holder.token:
            raise self._in_use(consumer_id, row, now, lost=True)
        if lease_ms is None:
            return
        values = {"holder": holder.token, "host": holder.host, "pid": holder.pid,
                  "expires_at": now + lease_ms}
        if row is None:
            conn.execute(t.consumer_leases.insert().values(
                table_id=table_id, consumer_id=consumer_id, **values))
        else:
            conn.execute(t.consumer_leases.update().where(where).values(**values))

    @staticmethod
    def _in_use(consumer_id: str, row: Any, now: int, lost: bool = False,
                known_alive: bool = False) -> ConsumerInUse:
        seconds = max(0.0, (int(row.expires_at) - now) / 1000)
        until = ("while it is open" if known_alive else
                 f"until its lease expires in {seconds:.0f} s (it renews it while it runs)")
        what = ("This stream's lease on consumer " if lost else "Consumer ") + repr(consumer_id)
        if lost:
            return ConsumerInUse(
                f"{what} was taken over by another stream (process {row.pid} on {row.host}), "
                "after this one was closed or went longer than its lease without polling or "
                "committing: its progress is no longer this stream's to record. Open the "
                "stream again once the other one is closed")
        return ConsumerInUse(
            f"{what} is held by another open stream (process {row.pid} on {row.host}) "
            f"{until}: two streams of one consumer would both get every change. Close the "
            "other stream (stream.close()), or use another consumer id")

    def consumers(self, table_id: int) -> pa.Table:
        """``consumer``, ``next_snapshot``, ``committed_at`` (UTC) per consumer, by id."""
        c = t.consumers.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.consumer_id, c.next_snapshot, c.committed_at)
                                .where(c.table_id == table_id).order_by(c.consumer_id)).all()
        table = rows_to_table(rows, pa.schema([
            ("consumer", pa.string()), ("next_snapshot", pa.int64()),
            ("committed_at", pa.int64())]))
        committed = table.column("committed_at").cast(pa.timestamp("ms", tz="UTC"))
        return table.set_column(2, pa.field("committed_at", committed.type), committed)

    def drop_consumer(self, table_id: int, consumer_id: str) -> bool:
        """Forget a consumer; whether it existed."""
        c = t.consumers.c
        with self._write() as conn:
            self._lock_table(conn, table_id)
            res = conn.execute(t.consumers.delete().where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id)))
        return bool(res.rowcount)

    def expire_consumers(self, table_id: int, committed_before_ms: int) -> list[str]:
        """Drop the consumers whose last commit is older than ``committed_before_ms``."""
        c = t.consumers.c
        stale = (c.table_id == table_id) & (c.committed_at < committed_before_ms)
        with self._write() as conn:
            self._lock_table(conn, table_id)
            ids = [r[0] for r in conn.execute(sa.select(c.consumer_id).where(stale))]
            if ids:
                conn.execute(t.consumers.delete().where(stale))
        return ids
