"""The bytes-bounded cache shared by the decoded vectors, key indexes and row-group starts."""

from __future__ import annotations

import os
import time

from arrowlake.io import deletion_vectors, prefetch
from arrowlake.io.lru import SizedLRU
from arrowlake.scan import deleted_rows, duckdb_relation, read
from arrowlake.table.keys import index as key_index
from arrowlake.table.keys import lookup as key_lookup
from arrowlake.table.keys import run_cache


def test_values_past_the_limit_drop_the_least_recently_used():
    cache: SizedLRU[bytes] = SizedLRU(10, len)
    cache.put("a", b"aaaa")
    cache.put("b", b"bbbb")
    assert cache.get("a") == b"aaaa"  # now the most recently used
    cache.put("c", b"cccc")  # 12 bytes: "b" goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"aaaa", None, b"cccc")


def test_a_value_replaces_the_one_before_and_is_counted_once():
    cache: SizedLRU[bytes] = SizedLRU(10, len)
    cache.put("a", b"aaaaaaaa")
    cache.put("a", b"aa")
    cache.put("b", b"bbbbbbbb")  # 10 bytes in all: both stay
    assert (cache.get("a"), cache.get("b")) == (b"aa", b"bbbbbbbb")


def test_a_value_larger_than_the_limit_is_not_kept_and_drops_the_old_one():
    cache: SizedLRU[bytes] = SizedLRU(4, len)
    cache.put("a", b"aa")
    cache.put("a", b"aaaaaa")
    assert cache.get("a") is None
    cache.put("b", b"bbbb")  # the dropped value no longer counts
    assert cache.get("b") == b"bbbb"


def test_pop_and_after_fork():
    cache: SizedLRU[bytes] = SizedLRU(10, len)
    cache.put("a", b"aa")
    cache.pop("a")
    cache.pop("missing")
    assert cache.get("a") is None
    cache.put("b", b"bb")
    cache.after_fork()
    assert cache.get("b") == b"bb"
    cache.after_fork(keep=False)
    assert cache.get("b") is None
    cache.put("c", b"c" * 10)  # nothing else counted after the reset
    assert cache.get("c") == b"c" * 10


def test_a_forked_child_uses_the_process_caches_while_the_parent_holds_their_locks():
    """A fork copies a lock held by another thread as held, and that thread is not in the
    child: each process cache takes a fresh lock in a forked child (Dask and DataLoader
    workers read through them)."""
    locks = [deletion_vectors._DECODED._lock, key_index._INDEXES._lock,
             deleted_rows._STARTS._lock, read._FRAGMENTS._lock, duckdb_relation._STORED._lock,
             duckdb_relation._TARGETS._lock, prefetch.FOOTERS._lock, key_lookup._KEYS._lock,
             run_cache.RUNS._lock]
    for lock in locks:
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: every cache must answer
            code = 1
            try:
                deletion_vectors._DECODED.get("x")
                key_index.cached("x", frozenset())
                deleted_rows._STARTS.get("x")
                read._FRAGMENTS.get("x")
                duckdb_relation._STORED.get("x")
                duckdb_relation._TARGETS.get("x")
                prefetch.FOOTERS.get(("x", 0))
                key_lookup._KEYS.get("x")
                run_cache.RUNS.get(("x", 0))
                code = 0
            finally:
                os._exit(code)
    finally:
        for lock in locks:
            lock.release()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child waited on a lock its parent held")


def test_a_put_may_bound_the_cache_by_its_own_limit_and_clear_empties_it() -> None:
    cache: SizedLRU[bytes] = SizedLRU(0, len)
    cache.put("a", b"x" * 10, limit=25)
    cache.put("b", b"y" * 10, limit=25)
    assert cache.get("a") == b"x" * 10 and cache.get("b") == b"y" * 10
    cache.put("c", b"z" * 10, limit=25)  # over 25 bytes: the least recently used goes
    assert cache.get("a") is None and cache.get("c") == b"z" * 10
    cache.put("d", b"w" * 30, limit=25)  # larger than the bound: not kept
    assert cache.get("d") is None
    cache.put("e", b"v", limit=0)  # a put under a bound of 0 keeps nothing
    assert cache.get("e") is None
    cache.clear()
    assert cache.get("b") is None and cache.get("c") is None
