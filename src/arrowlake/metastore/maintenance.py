"""What the maintenance service keeps in the metastore: its leases on buckets, so that two
services never compact the same bucket, and each table's last maintenance action of each kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.records import now_ms
from arrowlake.metastore.streams import LeaseHolder


class MaintenanceRecords(Database):
    """The maintenance queries of :class:`~arrowlake.metastore.store.Metastore`."""

    def acquire_bucket_leases(self, table_id: int, buckets: Iterable[int], holder: LeaseHolder,
                              lease_ms: int, alive: Callable[[Any], bool | None]) -> list[int]:
        """Of ``buckets``, those ``holder`` now holds for ``lease_ms``, in one transaction: the
        free ones, its own, and those of a holder known dead (``alive(row)`` False) or whose
        lease expired while ``alive`` cannot tell (None). A bucket whose holder is known alive,
        or whose lease still runs, stays with that holder."""
        c = t.maintenance_leases.c
        wanted = sorted({int(b) for b in buckets})
        if not wanted:
            return []
        taken: list[int] = []
        with self._write() as conn:
            # The table's row lock serializes this with every other service's leases (and is
            # held only for these few statements).
            self._lock_table(conn, table_id)
            now = now_ms()
            rows = {int(r.bucket): r for r in conn.execute(
                sa.select(t.maintenance_leases).where(
                    (c.table_id == table_id) & c.bucket.in_(wanted)))}
            values = {"holder": holder.token, "host": holder.host, "pid": holder.pid,
                      "expires_at": now + lease_ms}
            for bucket in wanted:
                row = rows.get(bucket)
                if row is None:
                    conn.execute(t.maintenance_leases.insert().values(
                        table_id=table_id, bucket=bucket, **values))
                elif row.holder == holder.token or _free(row, now, alive):
                    conn.execute(t.maintenance_leases.update().where(
                        (c.table_id == table_id) & (c.bucket == bucket)).values(**values))
                else:
                    continue
                taken.append(bucket)
        return taken

    def renew_bucket_leases(self, holder: LeaseHolder, lease_ms: int) -> int:
        """Extend every lease ``holder`` holds; how many it holds."""
        c = t.maintenance_leases.c
        with self._write() as conn:
            return int(conn.execute(t.maintenance_leases.update().where(
                c.holder == holder.token).values(expires_at=now_ms() + lease_ms)).rowcount)

    def release_bucket_leases(self, holder: LeaseHolder, table_id: int | None = None,
                              buckets: Iterable[int] | None = None) -> None:
        """Give up ``holder``'s leases (of one table, and of some of its buckets, if given)."""
        c = t.maintenance_leases.c
        where = c.holder == holder.token
        if table_id is not None:
            where = where & (c.table_id == table_id)
        if buckets is not None:
            where = where & c.bucket.in_(sorted({int(b) for b in buckets}))
        with self._write() as conn:
            conn.execute(t.maintenance_leases.delete().where(where))

    def bucket_leases(self, table_id: int) -> list[dict[str, Any]]:
        """The table's bucket leases: bucket, holder, host, pid, expires_at (epoch ms)."""
        c = t.maintenance_leases.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.bucket, c.holder, c.host, c.pid, c.expires_at)
                                .where(c.table_id == table_id).order_by(c.bucket)).all()
        return [dict(r._mapping) for r in rows]

    def table_heads(self) -> dict[int, int | None]:
        """Every table's current snapshot id, by table id: one query, so that a service woken
        by a commit finds which of its tables moved without looking into any of them."""
        c = t.tables.c
        with self._read() as conn:
            return {int(r[0]): None if r[1] is None else int(r[1]) for r in conn.execute(
                sa.select(c.table_id, c.current_snapshot_id))}

    def record_maintenance(self, table_id: int, action: str, detail: dict[str, Any]) -> None:
        """Record ``action`` (compact, expire, orphans) as the table's last one of its kind."""
        c = t.maintenance_log.c
        where = (c.table_id == table_id) & (c.action == action)
        values = {"at": now_ms(), "detail": json.dumps(detail, default=str)}
        with self._write() as conn:
            self._lock_table(conn, table_id)
            if conn.execute(t.maintenance_log.update().where(where).values(**values)).rowcount:
                return
            conn.execute(t.maintenance_log.insert().values(
                table_id=table_id, action=action, **values))

    def maintenance_actions(self, table_id: int) -> list[dict[str, Any]]:
        """The table's last maintenance action of each kind, newest first: action, at (epoch
        ms), detail (a dict)."""
        c = t.maintenance_log.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.action, c.at, c.detail)
                                .where(c.table_id == table_id)
                                .order_by(c.at.desc(), c.action)).all()
        return [{"action": r.action, "at": int(r.at), "detail": json.loads(r.detail)}
                for r in rows]


def _free(row: Any, now: int, alive: Callable[[Any], bool | None]) -> bool:
    state = alive(row)
    return state is False or (state is None and int(row.expires_at) <= now)
