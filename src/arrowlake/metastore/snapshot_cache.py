"""What a committed snapshot reads, kept in memory per :class:`Metastore`: its live files (per
content) and its live deletion vectors, so that planning a second scan of an unchanged
snapshot costs no query for them.

Why an entry can never go stale: the rows a snapshot ``S`` of table ``T`` reads are those with
``added_snapshot <= S`` and ``removed_snapshot`` null or ``> S``; once ``S`` is committed,
nothing changes that set. Every writer of ``al_files`` and ``al_vectors``:

- **Commits** (:mod:`~arrowlake.metastore.commits`: writes, deletes, ``compact``, mode
  switches' compactions, two-phase commits) insert rows with ``added_snapshot`` = the new
  snapshot's id and set ``removed_snapshot`` = that id on rows where it was null. The new id is
  the table's ``last_snapshot_id + 1``, above every snapshot the table ever had (nothing
  lowers ``last_snapshot_id``, expiry included), so no committed snapshot gains or loses a row. A
  commit from another connection or process changes nothing here for the same reason: it adds a
  snapshot, and a reader that resolves the current snapshot afresh (every scan does, in the one
  query that reloads the table) asks for the new id, which is not in the cache.
- **Expiry** (``expire_snapshots``) deletes snapshots and only the rows no retained snapshot
  reads (vector rows also when their file's row is gone, which happens only to files no
  retained snapshot reads), so a retained snapshot's entries stay exact. The expired
  snapshots' own entries are dropped when expiry runs through this metastore; after an expiry
  by another process, readers still fail on the expired snapshot where they resolve it
  (:class:`SnapshotNotFound`), and the current snapshot is never expired.
- **Dropping a table** deletes its rows; table ids come from ``AUTOINCREMENT`` on SQLite and a
  sequence on PostgreSQL (:mod:`~arrowlake.metastore.tables`) and are never handed out twice,
  so a table re-created under the same name has another id, and snapshot ids are per table.
  The dropped table's entries are freed when the drop runs through this metastore.
- **Migrations** run when a metastore is opened, before it caches anything; the only one that
  rewrites file rows (version 1 to 2 on SQLite) copies them with their ids, and no database
  reaches version 2 without it, so it cannot run while a metastore of this version is open.
- **Mode switches** (``deletion-vectors.enabled``) change only the table's properties: which
  mode a snapshot is read in is decided from the properties (``TableRecord.as_of``), not from
  the rows kept here. **Orphan removal** and the maintenance service delete storage files
  and write their leases and log, never file or vector rows.

An entry is filled only by a query that also finds the snapshot's own row (one statement, so
on PostgreSQL too it sees one state): a snapshot id not committed yet, or expired, is answered
from the database every time and never kept. Or by the commit that creates the snapshot
(``Commits._derived_entries``): its parent's entries, less the files it removed (and their
vectors), plus its vectors and its new file rows (read back inside its transaction, for their
ids), kept once that transaction has committed. The parent is the snapshot the commit found
current under the table's row lock, so nothing else came between them; a parent this cache
does not hold derives nothing. A write's next plan then costs no query for the snapshot it
just made.

The cache lives on one :class:`~arrowlake.metastore.store.Metastore` (one database), never in
a module global: a lake deleted and created again at the same path has the same ids for other
rows, and a new ``connect`` gets a new, empty cache. It is bounded by entries, file rows and
bytes, least recently used out first, and locked (streams plan on prefetch threads).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

#: Default bounds: file (or vector) rows held in all entries, their bytes, and entries.
MAX_ROWS = 1_000_000
MAX_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 256

_CACHES: weakref.WeakSet[SnapshotCache] = weakref.WeakSet()


class SnapshotCache:
    """A bounded least-recently-used map from ``(kind, table_id, snapshot_id, ...)`` keys to
    immutable values (Arrow tables, read-only mappings), each weighed by its rows and bytes.

    A value heavier than the bounds themselves is not kept.
    """

    def __init__(self, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[Any, int, int]] = OrderedDict()
        self.rows = 0
        self.bytes = 0
        self._lock = threading.Lock()
        _CACHES.add(self)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, rows: int, nbytes: int) -> None:
        rows = max(rows, 1)
        if rows > self.max_rows or nbytes > self.max_bytes or self.max_entries < 1:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.rows -= old[1]
                self.bytes -= old[2]
            self._entries[key] = (value, rows, nbytes)
            self.rows += rows
            self.bytes += nbytes
            while (self.rows > self.max_rows or self.bytes > self.max_bytes
                   or len(self._entries) > self.max_entries):
                _, (_, r, b) = self._entries.popitem(last=False)
                self.rows -= r
                self.bytes -= b

    def discard(self, table_id: int, snapshot_ids: Iterable[int] | None = None) -> None:
        """Forget the entries of ``table_id`` (of ``snapshot_ids`` only, when given). Keys
        hold the table id second and the snapshot id third."""
        only = None if snapshot_ids is None else {int(s) for s in snapshot_ids}
        with self._lock:
            for key in [k for k in self._entries if isinstance(k, tuple) and len(k) > 2
                        and k[1] == table_id and (only is None or k[2] in only)]:
                _, r, b = self._entries.pop(key)
                self.rows -= r
                self.bytes -= b

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.rows = self.bytes = 0


def _new_locks_in_child() -> None:
    # A fork (a DataLoader worker, say) copies a lock another thread may hold at that moment;
    # the child's copy would never be released. The entries stay valid: same database.
    for cache in list(_CACHES):
        cache._lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks_in_child)
