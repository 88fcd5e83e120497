"""Forking (DataLoader and multiprocessing workers) while a stream's SQLite watcher thread is
inside SQLite: SQLite guards its allocator with a process-wide mutex, which a child must not
inherit held. A fork therefore waits until the watcher is out of SQLite."""

from __future__ import annotations

import os
import threading
import time

import pytest

from arrowlake.metastore import signals

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")


def test_a_fork_waits_until_the_watcher_is_out_of_sqlite():
    held = threading.Event()
    released_at: list[float] = []

    def watcher_inside_sqlite() -> None:
        with signals._IN_SQLITE:  # what the watcher holds around each SQLite call
            held.set()
            time.sleep(0.3)
            released_at.append(time.monotonic())

    thread = threading.Thread(target=watcher_inside_sqlite)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked_at = time.monotonic()
    os.waitpid(pid, 0)
    thread.join()
    assert forked_at >= released_at[0]
    # The lock is free again in the parent (a watcher can go on).
    assert signals._IN_SQLITE.acquire(timeout=1)
    signals._IN_SQLITE.release()


def test_a_fork_does_not_wait_forever(monkeypatch):
    monkeypatch.setattr(signals, "FORK_WAIT", 0.2)
    signals._IN_SQLITE.acquire()  # a watcher stuck inside SQLite (a pool out of connections)
    try:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        assert 0.15 <= time.monotonic() - start < 5
    finally:
        signals._IN_SQLITE.release()
