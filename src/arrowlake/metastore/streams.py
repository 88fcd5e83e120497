"""What streams ask the metastore: snapshots after a position, the files a range of
snapshots added and removed, and consumers' persisted progress."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.records import (
    FILE_COLUMNS,
    FILE_SCHEMA,
    check_name,
    now_ms,
    rows_to_table,
)


class Streams(Database):
    """The stream and consumer queries of :class:`~arrowlake.metastore.store.Metastore`."""

    # -- streams -------------------------------------------------------------------------------

    _STREAM_SNAPSHOT_COLUMNS = ("snapshot_id", "parent_id", "kind", "committed_at",
                                "schema_id", "added_files", "removed_files", "summary")

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

    def commit_consumer(self, table_id: int, consumer_id: str, next_snapshot: int) -> None:
        """Record, in one transaction, that ``consumer_id`` resumes at ``next_snapshot``."""
        check_name("consumer", consumer_id)
        c = t.consumers.c
        with self._write() as conn:
            self._lock_table(conn, table_id)
            now = now_ms()
            res = conn.execute(t.consumers.update().where(
                (c.table_id == table_id) & (c.consumer_id == consumer_id)
            ).values(next_snapshot=next_snapshot, committed_at=now))
            if res.rowcount == 0:
                # The table row lock serializes this with every other consumer commit of the
                # table, so no concurrent insert of the same id can slip in between.
                conn.execute(t.consumers.insert().values(
                    table_id=table_id, consumer_id=consumer_id, next_snapshot=next_snapshot,
                    committed_at=now))

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
