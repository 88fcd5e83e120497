"""Commit signals: wake streams of a table as soon as a commit to it lands.

In one process, :meth:`Metastore.commit` publishes ``(metastore url, table id)`` after each
commit and every subscribed callback runs at once. Across processes on PostgreSQL, the commit
transaction also sends ``NOTIFY arrowlake_commit, '<table id>'``; :func:`listen` keeps one
connection per metastore URL that ``LISTEN``\\s and republishes what arrives here. Signals only
shorten waits: a stream that misses one still finds the commit at its next poll.
"""

from __future__ import annotations

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


def publish(url: str, table_id: int) -> None:
    """Wake every subscriber of the table in this process."""
    with _LOCK:
        callbacks = list(_LISTENERS.get((url, table_id), {}).values())
    for callback in callbacks:
        callback()


class _PgListener(threading.Thread):
    """One daemon thread per PostgreSQL metastore URL: LISTEN, republish each notification."""

    def __init__(self, url: str, engine: Any) -> None:
        super().__init__(name=f"arrowlake-listen-{url[:40]}", daemon=True)
        self.url = url
        self.engine = engine
        self.ready = threading.Event()

    def run(self) -> None:
        while True:
            try:
                raw = self.engine.raw_connection()
                conn = raw.driver_connection
                conn.autocommit = True
                conn.execute(f"LISTEN {CHANNEL}")
                self.ready.set()
                for note in conn.notifies():
                    try:
                        table_id = int(note.payload)
                    except ValueError:
                        continue
                    publish(self.url, table_id)
            except Exception:
                self.ready.set()
                threading.Event().wait(1.0)


_PG_LISTENERS: dict[str, _PgListener] = {}


def listen(url: str, engine: Any) -> None:
    """Make sure this process listens for commit notifications of a PostgreSQL metastore."""
    with _LOCK:
        listener = _PG_LISTENERS.get(url)
        if listener is None:
            listener = _PG_LISTENERS[url] = _PgListener(url, engine)
            listener.start()
    listener.ready.wait(10)
