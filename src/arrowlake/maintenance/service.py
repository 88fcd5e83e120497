"""The maintenance service: follows a lake's commits and looks after its tables.

It wakes on commits through the streams' signals (:mod:`arrowlake.metastore.signals`:
PostgreSQL ``NOTIFY``, SQLite's change counter, commits of this process at once): a wake-up
reads every table's current snapshot id in one query and works only on the tables that moved.
No loop looks into tables that did not change; time alone brings a table up only for its
housekeeping (expiry by ``snapshot.max-age``, orphan removal), at most every ``interval``
and ``orphans_every`` seconds.

Per table that moved: the due buckets of a table in ``compaction.mode`` deferred are compacted
under leases (:class:`~arrowlake.maintenance.actions.BucketLeases`), within the bytes-per-second
budget; then, once per ``interval``, snapshots are expired by its ``snapshot.retain-last`` and
``snapshot.max-age`` (consumers keep theirs), and once per ``orphans_every`` files older than its
``orphan.min-age`` that no snapshot references are deleted; last, a table with
``iceberg.publish = true`` gets its Iceberg metadata published (:mod:`.iceberg`). At most
``max_concurrent`` tables are worked on at once. Every action is reported (one
:class:`Action`) and recorded in the metastore as the table's last of its kind.

Stopping (``stop()``, or SIGTERM in ``arrowlake maintain``) lets the actions in progress finish
(a compaction stops after its current chunk of buckets) and then returns; leases are given up.
A service killed outright leaves at most the files of an uncommitted compaction, which its
next run (or any service's orphan removal) deletes once they are older than ``orphan.min-age``,
and leases that the next service on the machine takes over at once (elsewhere: at expiry).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from arrowlake.errors import TableNotFound
from arrowlake.maintenance.actions import (
    Action,
    BucketLeases,
    ByteBudget,
    compact_due,
    expire_by_policy,
    remove_orphans_by_policy,
)
from arrowlake.maintenance.iceberg import publish_by_policy
from arrowlake.metastore import signals
from arrowlake.table.options.maintenance import maintenance_policy
from arrowlake.table.table import Catalog, Table

#: The longest the service waits without reading the tables' heads: signals only shorten
#: waits (one missed, say while PostgreSQL's listening connection reconnected, is found here).
RECHECK_SECONDS = 30.0


@dataclass
class _TableState:
    table: Table
    seen: int | None = -1  # the snapshot last worked on (-1: never)
    expired_at: float = float("-inf")  # monotonic time of the last expiry check
    orphans_at: float = float("-inf")
    busy: bool = False
    again: bool = False  # moved while busy: work on it once more


class Maintainer:
    """Looks after the tables of one lake (all of them, or ``tables``); see the module doc.

    ``on_action`` is called with each :class:`Action` as it is taken (from worker threads, one
    at a time).
    """

    def __init__(self, catalog: Catalog, tables: Sequence[Table] | None = None, *,
                 max_concurrent: int = 1, bytes_per_second: float | None = None,
                 interval: float = 60.0, orphans_every: float = 3600.0,
                 lease_seconds: float = 60.0,
                 on_action: Callable[[Action], None] | None = None) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.catalog = catalog
        self.metastore = catalog.metastore
        self._fixed = None if tables is None else {t._record.table_id: t for t in tables}
        self.max_concurrent = max_concurrent
        self.budget = ByteBudget(bytes_per_second)
        self.interval = interval
        self.orphans_every = orphans_every
        self.leases = BucketLeases(lease_seconds)
        self._on_action = on_action
        self._emit_lock = threading.Lock()
        self.actions: list[Action] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._moved: set[int | None] = set()
        self._moved_lock = threading.Lock()
        self._states: dict[int, _TableState] = {}

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the actions in progress, start no new one, and return from :meth:`run`."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _emit(self, table: Table, action: Action) -> None:
        with contextlib.suppress(Exception):  # the record is informational: never fail on it
            self.metastore.record_maintenance(table._record.table_id, action.action,
                                              action.to_dict())
        with self._emit_lock:
            self.actions.append(action)
            if self._on_action is not None:
                self._on_action(action)

    # -- the tables ------------------------------------------------------------------------

    def _heads(self) -> dict[int, int | None]:
        heads = self.metastore.table_heads()
        if self._fixed is not None:
            heads = {k: v for k, v in heads.items() if k in self._fixed}
        return heads

    def _state(self, table_id: int) -> _TableState | None:
        state = self._states.get(table_id)
        if state is None:
            if self._fixed is not None:
                table = self._fixed[table_id]
            else:
                try:
                    table = Table(self.catalog, self.metastore.load_table_by_id(table_id))
                except TableNotFound:
                    return None
            state = self._states[table_id] = _TableState(table)
        return state

    # -- running ---------------------------------------------------------------------------

    def run(self, once: bool = True) -> list[Action]:
        """Look after the tables: with ``once``, every table once (compaction of deferred
        tables, expiry, orphans) and return; else until :meth:`stop`. The actions taken."""
        unsubscribe = signals.subscribe_lake(self.metastore.url, self._signal)
        releases: list[Callable[[], None]] = []
        if not once:
            if self.metastore.dialect == "postgresql":
                releases.append(signals.listen(self.metastore.url, self.metastore.engine))
            elif self.metastore.database_file() is not None:
                releases.append(signals.watch(self.metastore.url, self.metastore.engine))
        renewer = threading.Thread(target=self._renew, name="arrowlake-maintain-leases",
                                   daemon=True)
        renewer.start()
        pool = ThreadPoolExecutor(max_workers=self.max_concurrent,
                                  thread_name_prefix="arrowlake-maintain")
        try:
            self._loop(pool, once)
        finally:
            pool.shutdown(wait=True)
            self._stop.set()
            unsubscribe()
            for release in releases:
                release()
            with contextlib.suppress(Exception):
                self.metastore.release_bucket_leases(self.leases.holder)
        return list(self.actions)

    def _signal(self, table_id: int | None) -> None:
        with self._moved_lock:
            self._moved.add(table_id)
        self._wake.set()

    def _loop(self, pool: ThreadPoolExecutor, once: bool) -> None:
        running: dict[int, Future[None]] = {}
        first = True
        while not self._stop.is_set():
            self._wake.clear()
            with self._moved_lock:
                self._moved.clear()
            now = time.monotonic()
            heads = self._heads()
            for table_id in list(self._states):
                if table_id not in heads:  # dropped
                    del self._states[table_id]
            for table_id, head in heads.items():
                state = self._state(table_id)
                if state is None:
                    continue
                moved = head != state.seen
                timed = now - state.orphans_at >= self.orphans_every or (
                    now - state.expired_at >= self.interval and self._ages_out(state))
                if not (first or moved or timed):
                    continue
                if state.busy:
                    state.again = True
                    continue
                state.busy = True
                running[table_id] = pool.submit(self._work, state, head, first)
            first = False
            if once:
                for future in running.values():
                    future.result()
                return
            for table_id, future in list(running.items()):
                if future.done():
                    del running[table_id]
            self._wake.wait(self._next_due())

    def _ages_out(self, state: _TableState) -> bool:
        """Whether time alone can make snapshots of the table expire (``snapshot.max-age``)."""
        try:
            return maintenance_policy(state.table._record.properties).max_age is not None
        except Exception:
            return False

    def _next_due(self) -> float:
        """Seconds until the next table's housekeeping falls due by time alone (commits wake
        the service earlier); never more than :data:`RECHECK_SECONDS`."""
        now = time.monotonic()
        due = [now + RECHECK_SECONDS]
        for state in self._states.values():
            due.append(state.orphans_at + self.orphans_every)
            if self._ages_out(state):
                due.append(state.expired_at + self.interval)
        return max(0.05, min(due) - now)

    def _work(self, state: _TableState, head: int | None, everything: bool) -> None:
        table = state.table
        try:
            while True:
                state.again = False
                self._work_once(state, head, everything)
                if not state.again or self._stop.is_set():
                    break
                head = self.metastore.table_heads().get(table._record.table_id, head)
                everything = False
        except TableNotFound:
            pass  # dropped meanwhile: the next wake-up forgets it
        except Exception as exc:  # one table's failure must not stop the service
            self._emit(table, Action(table.name, "error", _now(), 0.0, error=str(exc)))
        finally:
            state.busy = False
            self._wake.set()  # what moved meanwhile is looked at again

    def _work_once(self, state: _TableState, head: int | None, everything: bool) -> None:
        table = state.table.refresh()
        state.seen = head
        policy = maintenance_policy(table._record.properties)
        if table._record.primary_key and policy.compaction_mode == "deferred":
            compact_due(table, self.leases, self.budget, self._stop,
                        lambda action: self._emit(table, action))
        if self._stop.is_set():
            return
        now = time.monotonic()
        if everything or now - state.expired_at >= self.interval:
            state.expired_at = now
            action = expire_by_policy(table)
            if action is not None:
                self._emit(table, action)
        if self._stop.is_set():
            return
        if everything or now - state.orphans_at >= self.orphans_every:
            state.orphans_at = now
            action = remove_orphans_by_policy(table)
            if action is not None:
                self._emit(table, action)
        if self._stop.is_set():
            return
        # After expiry, so that the published history holds only retained snapshots.
        action = publish_by_policy(table.refresh())
        if action is not None:
            self._emit(table, action)

    def _renew(self) -> None:
        while not self._stop.wait(self.leases.seconds / 4):
            with contextlib.suppress(Exception):  # a passing failure: the lease still runs
                self.metastore.renew_bucket_leases(self.leases.holder, self.leases.ms)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
