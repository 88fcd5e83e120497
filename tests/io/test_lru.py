"""The bytes-bounded cache shared by the decoded vectors, key indexes and row-group starts."""

from __future__ import annotations

from arrowlake.io.lru import SizedLRU


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
