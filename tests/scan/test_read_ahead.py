"""Files with deleted rows are read a few at a time, handed on in order."""

from __future__ import annotations

import threading
import time

import pytest

from arrowlake.scan.deleted_rows import read_ahead
from arrowlake.scan.grouping import consecutive_groups


def test_results_come_in_order_while_several_are_read_at_once() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def read(item: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02 if item % 2 == 0 else 0.001)  # later items finish first
        with lock:
            running -= 1
        return item * 10

    assert list(read_ahead(list(range(12)), read, ahead=4)) == [(i, i * 10) for i in range(12)]
    assert 2 <= most <= 4


def test_an_error_reaches_the_reader_and_a_closed_reader_stops_reading() -> None:
    def read(item: int) -> int:
        if item == 3:
            raise ValueError("damaged")
        return item

    with pytest.raises(ValueError, match="damaged"):
        list(read_ahead(list(range(8)), read, ahead=2))
    started: list[int] = []

    def slow(item: int) -> int:
        started.append(item)
        time.sleep(0.01)
        return item

    reader = read_ahead(list(range(100)), slow, ahead=3)
    assert next(reader) == (0, 0)
    reader.close()
    assert len(started) <= 5  # not the 100 a reader that kept going would have started


def test_small_items_are_read_in_groups_in_order() -> None:
    threads: dict[int, str] = {}

    def read(item: int) -> int:
        threads[item] = threading.current_thread().name
        return item * 10

    sizes = {i: (5 if i == 7 else 1) for i in range(20)}  # item 7 is a group of its own
    got = list(read_ahead(list(range(20)), read, ahead=2, size=sizes.__getitem__,
                          group_bytes=3))
    assert got == [(i, i * 10) for i in range(20)]
    # Consecutive items of one group are read by one task, so on one thread.
    assert threads[0] == threads[1] == threads[2]
    assert threads[3] == threads[4] == threads[5]
    assert len({threads[i] for i in range(20)}) <= 2


def test_items_that_fit_in_one_group_are_read_on_the_calling_thread() -> None:
    caller = threading.current_thread().name
    seen: set[str] = set()

    def read(item: int) -> int:
        seen.add(threading.current_thread().name)
        return item

    assert list(read_ahead(list(range(6)), read, size=lambda _: 10, group_bytes=100)) == \
        [(i, i) for i in range(6)]
    assert seen == {caller}


def test_consecutive_groups_keep_the_order_and_the_bound() -> None:
    sizes = [1, 2, 3, 4, 9, 1, 1]
    groups = consecutive_groups(sizes, lambda n: n, 5)
    assert groups == [[1, 2], [3], [4], [9], [1, 1]]
    assert [n for g in groups for n in g] == sizes
    assert all(sum(g) <= 5 or len(g) == 1 for g in groups)
    assert consecutive_groups([], len, 5) == []
