"""Commit signals: wake streams of a table as soon as a commit to it lands.

In one process, :meth:`Metastore.commit` publishes ``(metastore url, table id)`` after each
commit and every subscribed callback runs at once. Across processes on PostgreSQL, the commit
transaction also sends ``NOTIFY arrowlake_commit, '<table id>'``; :func:`listen` keeps one
connection per metastore URL that ``LISTEN``\\s and republishes what arrives here. SQLite has no
notifications: :func:`watch` keeps one connection per database and reads its change counter
(``PRAGMA data_version``, which changes when any other connection, in any process, commits)
every ``CHECK_INTERVAL`` seconds, waking the streams of that database when it changed. That
check reads the counter from SQLite's shared memory (no query plan, no file read), so it is
cheap at a fine granularity; the streams then run their full poll only when something was
committed. Signals only shorten waits: a stream that misses one still finds the commit at its
next poll.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

#: The PostgreSQL notification channel commits are announced on (payload: the table id).
CHANNEL = "arrowlake_commit"

_LOCK = threading.Lock()
_LISTENERS: dict[tuple[str, int], dict[int, Callable[[], None]]] = {}
_NEXT = iter(range(1, 1 << 62))


def subscribe(url: str, table_id: int, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` (from any thread) after each commit to the table; returns the
    function that unsubscribes it. Callbacks must be quick and must not raise."""
    key = (url, table_id)
    with _LOCK:
        token = next(_NEXT)
        _LISTENERS.setdefault(key, {})[token] = callback

    def unsubscribe() -> None:
        with _LOCK:
            listeners = _LISTENERS.get(key)
            if listeners is not None:
                listeners.pop(token, None)
                if not listeners:
                    del _LISTENERS[key]

    return unsubscribe


_LAKE_LISTENERS: dict[str, dict[int, Callable[[int | None], None]]] = {}


def subscribe_lake(url: str, callback: Callable[[int | None], None]) -> Callable[[], None]:
    """Call ``callback(table_id)`` (from any thread) after each commit to any table of the
    metastore, tables created later included (``table_id`` None: some table, which one is not
    known, as with SQLite's change counter); returns the function that unsubscribes it."""
    with _LOCK:
        token = next(_NEXT)
        _LAKE_LISTENERS.setdefault(url, {})[token] = callback

    def unsubscribe() -> None:
        with _LOCK:
            listeners = _LAKE_LISTENERS.get(url)
            if listeners is not None:
                listeners.pop(token, None)
                if not listeners:
                    del _LAKE_LISTENERS[url]

    return unsubscribe


def publish(url: str, table_id: int | None) -> None:
    """Wake every subscriber of the table in this process (of every table of the metastore
    when ``table_id`` is None), and every subscriber of the whole metastore."""
    with _LOCK:
        if table_id is None:
            callbacks = [c for (u, _), subs in _LISTENERS.items() if u == url
                         for c in subs.values()]
        else:
            callbacks = list(_LISTENERS.get((url, table_id), {}).values())
        lake = list(_LAKE_LISTENERS.get(url, {}).values())
    for callback in callbacks:
        callback()
    for each in lake:
        each(table_id)


class _UrlThread(threading.Thread):
    """A daemon thread shared by the streams of one metastore URL (see :func:`_share`): it runs
    until ``stop`` is set, after its last user left; ``ready`` is set once it is listening."""

    PREFIX = "arrowlake"

    def __init__(self, url: str, engine: Any) -> None:
        super().__init__(name=f"{self.PREFIX}-{url[:40]}", daemon=True)
        self.url = url
        self.engine = engine
        self.ready = threading.Event()
        self.users = 0
        self.stop = threading.Event()


class _PgListener(_UrlThread):
    """One daemon thread per PostgreSQL metastore URL: LISTEN, republish each notification.
    It holds one connection while streams of that URL are open and closes it after the last."""

    PREFIX = "arrowlake-listen"

    def run(self) -> None:
        while not self.stop.is_set():
            raw = None
            try:
                raw = self.engine.raw_connection()
                conn = raw.driver_connection
                conn.autocommit = True
                conn.execute(f"LISTEN {CHANNEL}")
                self.ready.set()
                while not self.stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        try:
                            table_id = int(note.payload)
                        except ValueError:
                            continue
                        publish(self.url, table_id)
            except Exception:  # a lost connection: reconnect after a pause
                self.ready.set()
                self.stop.wait(1.0)
            finally:
                if raw is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        raw.invalidate()  # LISTEN state must not go back to the pool


#: Seconds between two checks of an SQLite database's change counter (see :func:`watch`).
CHECK_INTERVAL = 0.01


#: Held by the SQLite watchers while they call into SQLite, and by a thread that forks while
#: it forks (:func:`_before_fork`). SQLite guards its allocator with a process-wide mutex: a
#: fork while a watcher held it (opening its connection, say) left the child blocked on it
#: forever, as soon as it opened a database itself (seen with DataLoader workers forked right
#: after a stream started).
_IN_SQLITE = threading.Lock()
#: The longest a fork waits for a watcher to leave SQLite (its calls take microseconds; only
#: a connection pool that is out of connections could keep it longer).
FORK_WAIT = 2.0


class _SqliteWatcher(_UrlThread):
    """One daemon thread per SQLite metastore URL: check ``PRAGMA data_version`` every
    ``CHECK_INTERVAL`` seconds and wake the URL's streams when it changed."""

    PREFIX = "arrowlake-watch"

    def run(self) -> None:
        while not self.stop.is_set():
            raw = None
            try:
                with _IN_SQLITE:
                    raw = self.engine.raw_connection()
                    cursor = raw.driver_connection.cursor()
                    # Outside any transaction (the engine's connections run in autocommit
                    # mode between BEGINs), so each read sees the newest committed state.
                    last = cursor.execute("PRAGMA data_version").fetchone()[0]
                while not self.stop.wait(CHECK_INTERVAL):
                    with _IN_SQLITE:
                        version = cursor.execute("PRAGMA data_version").fetchone()[0]
                    if version != last:
                        last = version
                        publish(self.url, None)
            except Exception:  # a database that cannot be opened now: try again after a pause
                self.stop.wait(1.0)
            finally:
                if raw is not None:
                    with _IN_SQLITE, contextlib.suppress(Exception):
                        raw.close()


_PG_LISTENERS: dict[str, _UrlThread] = {}
_SQLITE_WATCHERS: dict[str, _UrlThread] = {}


def _share(registry: dict[str, _UrlThread], url: str, engine: Any,
           make: Callable[[str, Any], _UrlThread]) -> tuple[_UrlThread, Callable[[], None]]:
    """The URL's running thread in ``registry`` (started by ``make`` if there is none), and a
    function to call once when done with it: the last user stops it."""
    with _LOCK:
        thread = registry.get(url)
        if thread is None:
            thread = registry[url] = make(url, engine)
            thread.start()
        thread.users += 1
    done = threading.Event()

    def release() -> None:
        if done.is_set():
            return
        done.set()
        with _LOCK:
            thread.users -= 1
            if thread.users == 0:
                thread.stop.set()
                registry.pop(url, None)

    return thread, release


def watch(url: str, engine: Any) -> Callable[[], None]:
    """Watch an SQLite metastore for commits of any connection while the returned function has
    not been called (one thread and connection per URL, shared by the process's streams)."""
    return _share(_SQLITE_WATCHERS, url, engine, _SqliteWatcher)[1]


def listen(url: str, engine: Any) -> Callable[[], None]:
    """Listen for commit notifications of a PostgreSQL metastore while the returned function
    has not been called (one connection per URL, shared by the process's streams)."""
    listener, release = _share(_PG_LISTENERS, url, engine, _PgListener)
    listener.ready.wait(10)
    return release


_FORKING = threading.local()  # per forking thread: whether it holds _IN_SQLITE


def _before_fork() -> None:
    """Fork only once no watcher is inside SQLite (waiting at most ``FORK_WAIT`` seconds)."""
    _FORKING.holds = _IN_SQLITE.acquire(timeout=FORK_WAIT)


def _after_fork_in_parent() -> None:
    if getattr(_FORKING, "holds", False):
        _FORKING.holds = False
        _IN_SQLITE.release()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader or multiprocessing worker) has none of the parent's
    threads: forget the parent's watchers and listeners, whose threads would never wake the
    child's streams, and take fresh locks, since the parent's may have been held by one of
    those threads at the fork (the child would then wait on them forever)."""
    global _LOCK, _IN_SQLITE, _FORKING
    _LOCK = threading.Lock()
    _IN_SQLITE = threading.Lock()
    _FORKING = threading.local()
    _SQLITE_WATCHERS.clear()
    _PG_LISTENERS.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
