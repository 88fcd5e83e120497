"""Writes in flight: known to the metastore from before their first file until they end.

Orphan removal may delete a file only once no write can still commit it. Age alone cannot
tell: a slow input, a long Flight put or a Spark job whose tasks write for an hour before the
driver commits all produce files older than any age one would choose. So every write registers
first (``al_writes``: a random ``write_id``, the table, where its holder runs, a lease), puts
``<write_id>-`` in front of the name of every file it writes, and ends its registration when it
commits or aborts. Its holder renews the lease from a background thread while it lives.

Orphan removal lists files, then revokes the registrations whose holder is gone (its process
on this machine no longer runs) or whose lease ran out, then reads the live ones and the
referenced files, and deletes only unreferenced files that no live registration claims. A
commit checks, inside its transaction, that its registration still exists: a write revoked
while it was stalled fails with nothing committed instead of committing files that may have
been deleted. Executors never touch the database: a Spark or Dask driver registers the write,
and its tasks write under the driver's ``write_id``.

Within a process the registration a write runs under is a context variable, so every file
writer below the table layer names its files without the id being passed down each call.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from arrowlake.errors import CommitConflict
from arrowlake.metastore import tables as t
from arrowlake.metastore.database import Database
from arrowlake.metastore.holders import HOST, holder_alive
from arrowlake.metastore.records import now_ms

#: How long a registration lasts unless renewed. Its holder renews it every quarter of that;
#: a holder on another machine that died is noticed once it runs out.
LEASE_SECONDS = 300.0

#: How long a detached registration (a Spark data source write) lasts after it was made or
#: last committed under: a job that runs longer between commits fails its commit (nothing
#: committed), and a crashed job's files are left alone this long before orphan removal may
#: take them.
DETACHED_LEASE_SECONDS = 86400.0

#: The registration the current write runs under (its ``write_id``), if any.
CURRENT_WRITE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "arrowlake_current_write", default=None)

_WRITE_ID = re.compile(r"^([0-9a-f]{32})-")


def write_id_of(file_name: str) -> str | None:
    """The registration a file was written under, from its name (None: a file written
    without one, by an older arrowlake or another tool)."""
    match = _WRITE_ID.match(file_name.rsplit("/", 1)[-1])
    return None if match is None else match.group(1)


class InflightWrites(Database):
    """The registrations of writes in flight, part of
    :class:`~arrowlake.metastore.store.Metastore`."""

    def register_write(self, table_id: int | None, kind: str, lease_ms: int, *,
                       detached: bool = False) -> str:
        """Register a write (to ``table_id``, or to several tables when None); its
        ``write_id``. Held by this process, or ``detached``: held by no process, kept by its
        lease alone (see :class:`WriteRegistration`)."""
        write_id = uuid.uuid4().hex
        now = now_ms()
        with self._write() as conn:
            if table_id is not None:
                self._lock_table(conn, table_id)
            conn.execute(t.writes.insert().values(
                write_id=write_id, table_id=table_id, kind=kind[:32], host=HOST,
                pid=0 if detached else os.getpid(), started_at=now,
                expires_at=now + lease_ms, lease_ms=lease_ms))
        return write_id

    def renew_writes(self, write_ids: Sequence[str], lease_ms: int | None = None) -> set[str]:
        """Extend the leases of ``write_ids`` by their own lease (or by ``lease_ms``); the ids
        still registered."""
        if not write_ids:
            return set()
        c = t.writes.c
        until = now_ms() + (c.lease_ms if lease_ms is None else lease_ms)
        with self._write() as conn:
            conn.execute(t.writes.update().where(c.write_id.in_(list(write_ids)))
                         .values(expires_at=until))
            return set(conn.execute(sa.select(c.write_id).where(
                c.write_id.in_(list(write_ids)))).scalars())

    def end_write(self, write_id: str) -> None:
        with self._write() as conn:
            conn.execute(t.writes.delete().where(t.writes.c.write_id == write_id))

    def live_writes(self) -> list[dict[str, Any]]:
        """The lake's registered writes: write_id, table_id, kind, host, pid, started_at,
        expires_at (epoch ms)."""
        c = t.writes.c
        with self._read() as conn:
            rows = conn.execute(sa.select(c.write_id, c.table_id, c.kind, c.host, c.pid,
                                          c.started_at, c.expires_at)
                                .order_by(c.started_at)).all()
        return [dict(r._mapping) for r in rows]

    def revoke_dead_writes(self) -> list[str]:
        """Delete the registrations of writes that can no longer commit: their holder is gone,
        or their lease ran out. A row is deleted only if it still is what was judged (not
        renewed meanwhile), in a transaction that a commit checking the same row serializes
        with. The ids revoked."""
        c = t.writes.c
        now = now_ms()
        with self._write() as conn:
            rows = conn.execute(sa.select(c.write_id, c.host, c.pid, c.expires_at)
                                .with_for_update()).all()
            dead = [r for r in rows if r.expires_at < now or holder_alive(r) is False]
            for r in dead:
                conn.execute(t.writes.delete().where(
                    (c.write_id == r.write_id) & (c.expires_at == r.expires_at)))
        return [r.write_id for r in dead]

    @staticmethod
    def check_registered(conn: sa.Connection, write_id: str) -> None:
        """Inside a commit: the write must still be registered (see the module docs)."""
        c = t.writes.c
        # Extending the lease locks the row too, so a revocation waits for this commit (or
        # this commit finds the row gone); a detached write's lease runs from its last commit.
        found = conn.execute(t.writes.update().where(c.write_id == write_id)
                             .values(expires_at=now_ms() + c.lease_ms)).rowcount
        if found == 0:
            raise CommitConflict(
                f"The write {write_id} is no longer registered as in flight: its lease ran out "
                "(or its process was taken for dead) and orphan removal may have deleted its "
                "files. Nothing was committed and the table is unchanged; run the write again")


class _Heartbeat:
    """One daemon thread per process renewing the leases of its writes in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes: dict[str, tuple[weakref.ref[Any], int]] = {}  # id -> (metastore, pid)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_beat = 0.0  # when the thread renews next (monotonic)

    def add(self, metastore: InflightWrites, write_id: str) -> None:
        with self._lock:
            self._writes[write_id] = (weakref.ref(metastore), os.getpid())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="arrowlake-write-heartbeat")
                self._next_beat = time.monotonic() + LEASE_SECONDS / 4
                self._thread.start()
            elif time.monotonic() + LEASE_SECONDS / 4 < self._next_beat:
                self._wake.set()  # the lease got shorter than the thread's sleep

    def remove(self, write_id: str) -> None:
        with self._lock:
            self._writes.pop(write_id, None)

    def _run(self) -> None:
        while True:
            self._wake.wait(max(0.0, self._next_beat - time.monotonic()))
            self._wake.clear()
            with self._lock:
                self._next_beat = time.monotonic() + LEASE_SECONDS / 4
                pid = os.getpid()
                # A forked child inherits the entries but holds none of the writes.
                mine = {w: ref for w, (ref, owner) in self._writes.items() if owner == pid}
                if not mine:
                    self._thread = None
                    return
            by_store: dict[int, tuple[InflightWrites, list[str]]] = {}
            for write_id, ref in mine.items():
                store = ref()
                if store is not None:
                    by_store.setdefault(id(store), (store, []))[1].append(write_id)
            for store, ids in by_store.values():
                # A database briefly unreachable is retried at the next beat; the lease has
                # three more beats before it runs out.
                with contextlib.suppress(Exception):
                    store.renew_writes(ids, int(LEASE_SECONDS * 1000))


_HEARTBEAT = _Heartbeat()


class WriteRegistration:
    """A write registered in flight (see the module docs). Use it as a context manager around
    the write: files written inside carry its id, and the registration ends on exit.

    An attached registration (the default) is held by this process: a background thread
    renews it every quarter of :data:`LEASE_SECONDS`, and it ends when the object is collected,
    so a registration a driver forgets does not protect its files for as long as the process
    lives. A detached one (``detached_lease`` seconds) is held by no process: for a Spark data
    source write, whose driver-side Python processes make the write in one process and commit
    it in another, it is kept by its lease alone, which each commit under it extends, and ends
    only when :meth:`end` is called or the lease runs out.
    """

    def __init__(self, metastore: InflightWrites, table_id: int | None, kind: str, *,
                 detached_lease: float | None = None) -> None:
        self.table_id = table_id
        self.detached = detached_lease is not None
        lease = LEASE_SECONDS if detached_lease is None else detached_lease
        self.write_id = metastore.register_write(table_id, kind, int(lease * 1000),
                                                 detached=self.detached)
        self._tokens: list[contextvars.Token[str | None]] = []
        self._finalizer: Any
        if self.detached:
            self._finalizer = weakref.finalize(self, lambda: None)
            self._metastore_ref = weakref.ref(metastore)
            return
        _HEARTBEAT.add(metastore, self.write_id)
        self._finalizer = weakref.finalize(self, _end, weakref.ref(metastore), self.write_id,
                                           os.getpid())

    def end(self) -> None:
        """End the registration (idempotent): the write committed or gave up."""
        if self.detached:
            metastore = self._metastore_ref()
            if metastore is not None and self._finalizer.alive:
                metastore.end_write(self.write_id)
        self._finalizer()

    def __enter__(self) -> WriteRegistration:
        self._tokens.append(CURRENT_WRITE.set(self.write_id))
        return self

    def __exit__(self, *exc: object) -> None:
        CURRENT_WRITE.reset(self._tokens.pop())
        self.end()


def _end(metastore_ref: weakref.ref[Any], write_id: str, pid: int) -> None:
    _HEARTBEAT.remove(write_id)
    metastore = metastore_ref()
    if metastore is None or os.getpid() != pid:
        return
    # At exit, or with the database gone, the row is left to its lease and holder check.
    with contextlib.suppress(Exception):
        metastore.end_write(write_id)


@contextlib.contextmanager
def writing_under(write_id: str | None) -> Iterator[None]:
    """Files written and commits made inside belong to the registration ``write_id`` (an
    executor's task writing for its driver's registration; None: leave the current one)."""
    if write_id is None:
        yield
        return
    token = CURRENT_WRITE.set(write_id)
    try:
        yield
    finally:
        CURRENT_WRITE.reset(token)


@contextlib.contextmanager
def registered_write(metastore: InflightWrites, table_id: int | None, kind: str
                     ) -> Iterator[str | None]:
    """Run a write under a registration: a new one, or the one already current (a write
    inside another, such as a compaction after an upsert or the writes of one transaction,
    shares it: registrations are checked by id, whatever table a file belongs to)."""
    if CURRENT_WRITE.get() is not None:
        yield CURRENT_WRITE.get()
        return
    with WriteRegistration(metastore, table_id, kind) as registration:
        yield registration.write_id


def new_file_name(suffix: str) -> str:
    """A fresh file name for a file of the current write (``<write_id>-<random>.<suffix>``),
    or a plain random one outside a registered write."""
    write_id = CURRENT_WRITE.get()
    random_part = uuid.uuid4().hex
    if write_id is None:
        return f"{random_part}.{suffix}"
    return f"{write_id}-{random_part[:16]}.{suffix}"
