"""Change streams: start modes, row kinds, consumers, shards, wake-up, sync and async reading."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import ConsumerInUse, SnapshotNotFound, ValidationError
from tests.conftest import make_lake

KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), ("region", pa.string()),
                   ("amount", pa.int64())])
PLAIN = pa.schema([("id", pa.int64()), ("region", pa.string())])


def rows(change: al.Change, key: str = "k") -> list[dict]:
    return sorted(change.to_arrow().to_pylist(), key=lambda r: (r[key], r.get("_row_kind")))


def drain(stream: al.Stream) -> list[al.Change]:
    return list(stream)


def test_full_start_then_one_change_per_snapshot_on_a_key_table(lake):
    t = lake.create_table("s.kv", KEYED, deletion_vectors=False, primary_key=["k"], buckets=4)
    t.upsert({"k": [1, 2, 3], "region": ["EU", "US", "EU"], "amount": [10, 20, 30]})
    t.upsert({"k": [1], "region": ["EU"], "amount": [11]})
    stream = t.stream(include_row_kind=True, stop_at_latest=True)
    first = drain(stream)
    assert [c.kind for c in first] == ["full"]
    assert first[0].snapshot_id == 2
    assert rows(first[0]) == [
        {"k": 1, "region": "EU", "amount": 11, "_row_kind": "+I"},
        {"k": 2, "region": "US", "amount": 20, "_row_kind": "+I"},
        {"k": 3, "region": "EU", "amount": 30, "_row_kind": "+I"}]
    t.upsert({"k": [2, 4], "region": ["US", "EU"], "amount": [21, 40]})
    t.delete("k = 3")
    t.compact(full=True)  # changes no rows: yields nothing
    changes = drain(stream)
    assert [(c.snapshot_id, c.kind) for c in changes] == [(3, "upsert"), (4, "delete")]
    assert rows(changes[0]) == [
        {"k": 2, "region": "US", "amount": 21, "_row_kind": "+I"},
        {"k": 4, "region": "EU", "amount": 40, "_row_kind": "+I"}]
    assert rows(changes[1]) == [{"k": 3, "region": "EU", "amount": 30, "_row_kind": "-D"}]
    assert stream.position == 5
    assert drain(stream) == []


def test_append_table_changes_are_exact_rows_added_and_removed(lake):
    t = lake.create_table("s.plain", PLAIN)
    t.append({"id": [1, 2, 3, 4], "region": ["EU", "US", "EU", "US"]})
    stream = t.stream(start="latest", include_row_kind=True, stop_at_latest=True)
    assert drain(stream) == []
    t.append({"id": [5], "region": ["EU"]})
    t.delete("id = 2")  # rewrites the first file: 1, 3, 4 carried over, not changes
    t.overwrite({"id": [30], "region": ["EU"]}, "region = 'EU' and id >= 3")
    t.delete("region = 'US' or region = 'EU'")  # removes every file whole
    got = [(c.kind, rows(c, "id")) for c in drain(stream)]
    assert got == [
        ("append", [{"id": 5, "region": "EU", "_row_kind": "+I"}]),
        ("delete", [{"id": 2, "region": "US", "_row_kind": "-D"}]),
        ("overwrite", [{"id": 3, "region": "EU", "_row_kind": "-D"},
                       {"id": 5, "region": "EU", "_row_kind": "-D"},
                       {"id": 30, "region": "EU", "_row_kind": "+I"}]),
        ("delete", [{"id": 1, "region": "EU", "_row_kind": "-D"},
                    {"id": 4, "region": "US", "_row_kind": "-D"},
                    {"id": 30, "region": "EU", "_row_kind": "-D"}]),
    ]


def test_a_delete_read_after_its_columns_were_renamed_removes_the_same_rows(sqlite_lake):
    """A delete records its filter in the names of its time; a stream reading it after a
    rename (and after another column took the old name) reads it by field id."""
    t = sqlite_lake.create_table("s.plain", PLAIN)
    t.append({"id": [1, 2, 3], "region": ["EU", "US", "EU"]})
    opened_before = t.stream(start="latest", include_row_kind=True, stop_at_latest=True)
    assert drain(opened_before) == []
    t.delete("region = 'US'")
    t.rename_column("region", "area")
    t.add_column("region", pa.string())
    t.append({"id": [4], "area": ["EU"], "region": ["US"]})
    # A stream keeps the schema it was opened with (columns followed by field id).
    assert [(c.kind, rows(c, "id")) for c in drain(opened_before)] == [
        ("delete", [{"id": 2, "region": "US", "_row_kind": "-D"}]),
        ("append", [{"id": 4, "region": "EU", "_row_kind": "+I"}]),
    ]
    stream = t.stream(start=2, include_row_kind=True, stop_at_latest=True)  # the delete
    got = [(c.kind, rows(c, "id")) for c in drain(stream)]
    assert got == [
        ("delete", [{"id": 2, "area": "US", "region": None, "_row_kind": "-D"}]),
        ("append", [{"id": 4, "area": "EU", "region": "US", "_row_kind": "+I"}]),
    ]


def test_a_delete_by_a_column_dropped_since_is_refused_with_a_clear_error(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    t.append({"id": [1, 2], "region": ["EU", "US"]})
    t.delete("region = 'US'")
    t.drop_column("region")
    with pytest.raises(ValidationError, match="dropped since"):
        drain(t.stream(start=2, stop_at_latest=True))
    assert [c.kind for c in t.stream(start="latest", stop_at_latest=True)] == []


def test_filter_columns_and_row_kind_column(sqlite_lake):
    t = sqlite_lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=2)
    t.upsert({"k": [1, 2], "region": ["EU", "US"], "amount": [1, 2]})
    plain = t.stream(filter="region = 'EU'", columns=["k", "amount"], stop_at_latest=True)
    [full] = drain(plain)
    assert full.to_arrow().to_pylist() == [{"k": 1, "amount": 1}]
    assert full.schema.names == ["k", "amount"]
    t.upsert({"k": [3, 4], "region": ["EU", "US"], "amount": [3, 4]})
    [change] = drain(plain)
    assert change.to_arrow().to_pylist() == [{"k": 3, "amount": 3}]
    assert change.to_pandas().to_dict("records") == [{"k": 3, "amount": 3}]
    assert pa.Table.from_batches(list(change.to_batches()), change.schema).to_pylist() == \
        [{"k": 3, "amount": 3}]
    with pytest.raises(Exception, match="nope"):
        t.stream(columns=["nope"])
    with pytest.raises(al.FilterSyntaxError):
        t.stream(filter="region = ")


def test_start_modes(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    for i in range(4):
        t.append({"id": [i], "region": ["EU"]})
        time.sleep(0.01)
    between = datetime.now(UTC)
    time.sleep(0.01)
    t.append({"id": [4], "region": ["EU"]})

    def ids(**kw):
        return [(c.snapshot_id, sorted(c.to_arrow().column("id").to_pylist()))
                for c in t.stream(stop_at_latest=True, **kw)]

    assert ids() == [(5, [0, 1, 2, 3, 4])]
    assert ids(start="latest") == []
    assert ids(start="earliest") == [(1, [0]), (2, [1]), (3, [2]), (4, [3]), (5, [4])]
    assert ids(start=4) == [(4, [3]), (5, [4])]
    assert ids(start=between) == [(5, [4])]
    assert ids(start=datetime(2000, 1, 1)) == ids(start="earliest")
    t.expire_snapshots(retain_last=2)
    # The changes of expired snapshots are gone; their state is not: a full scan, then changes.
    assert ids(start="earliest") == [(4, [0, 1, 2, 3]), (5, [4])]
    with pytest.raises(SnapshotNotFound):
        t.stream(start=2)
    for bad in ("soon", 1.5, True):
        with pytest.raises(ValidationError):
            t.stream(start=bad)


def test_empty_table_stream_sees_first_commit(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    stream = t.stream(stop_at_latest=True)
    assert drain(stream) == []
    t.append({"id": [1], "region": ["EU"]})
    assert [c.snapshot_id for c in drain(stream)] == [1]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_consumer_progress_commit_resume_list_and_drop(kind, tmp_path, request):
    from tests.conftest import make_lake

    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.plain", PLAIN)
    t.append({"id": [1], "region": ["EU"]})
    with t.stream(consumer="etl", stop_at_latest=True) as stream:
        [full] = list(stream)
        stream.commit(full.snapshot_id)
    t.append({"id": [2], "region": ["EU"]})
    t.append({"id": [3], "region": ["EU"]})
    with t.stream(consumer="etl", stop_at_latest=True) as stream:
        first = next(iter(stream))
        assert (first.snapshot_id, first.to_arrow().column("id").to_pylist()) == (2, [2])
        stream.commit(first.snapshot_id)
    before = datetime.now(UTC)
    consumers = t.consumers()
    assert consumers.column_names == ["consumer", "next_snapshot", "committed_at"]
    assert consumers.column("consumer").to_pylist() == ["etl"]
    assert consumers.column("next_snapshot").to_pylist() == [3]
    assert consumers.column("committed_at")[0].as_py() <= before
    # A restart resumes after the last commit, whatever start says.
    resumed = [c.snapshot_id for c in t.stream(consumer="etl", start="latest",
                                                stop_at_latest=True)]
    assert resumed == [3]
    t.drop_consumer("etl")
    assert t.consumers().num_rows == 0
    with pytest.raises(ValidationError):
        t.drop_consumer("etl")
    with pytest.raises(ValidationError, match="consumer"):
        t.stream(stop_at_latest=True).commit(1)
    with pytest.raises(al.ArrowlakeError):
        t.stream(consumer="bad\nname")
    lake.drop_table("s.plain")
    lake.close()


def test_async_for_and_with(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    t.append({"id": [1], "region": ["EU"]})

    async def read_all() -> list[int]:
        seen = []
        with t.stream(stop_at_latest=True) as stream:
            async for change in stream:
                seen.append(change.snapshot_id)
        return seen

    assert asyncio.run(read_all()) == [1]

    async def wait_for_commit() -> tuple[list[int], float]:
        stream = t.stream(start="latest", poll_interval=30)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        loop.call_later(0.2, lambda: threading.Thread(
            target=t.append, args=({"id": [2], "region": ["EU"]},)).start())
        change = await stream.__anext__()
        stream.close()
        return [change.snapshot_id], time.monotonic() - started

    got, elapsed = asyncio.run(wait_for_commit())
    assert got == [2]
    assert elapsed < 5  # woken by the commit, not by the 30 s poll


def test_commit_in_process_wakes_a_waiting_stream_and_close_ends_it(sqlite_lake):
    t = sqlite_lake.create_table("s.plain", PLAIN)
    stream = t.stream(start="latest", poll_interval=60)
    got: list[tuple[int, float]] = []

    def consume() -> None:
        for change in stream:
            got.append((change.snapshot_id, time.monotonic()))

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(0.3)
    committed = time.monotonic()
    t.append({"id": [1], "region": ["EU"]})
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got and got[0][0] == 1
    assert got[0][1] - committed < 2  # far below the 60 s poll interval
    stream.close()
    reader.join(5)
    assert not reader.is_alive()


def test_splits_are_picklable_and_read_alike(lake):
    t = lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=3)
    t.upsert({"k": list(range(20)), "region": ["EU"] * 20, "amount": list(range(20))})
    t.delete("k < 5")
    stream = t.stream(start="earliest", include_row_kind=True, stop_at_latest=True)
    for change in stream:
        copies = pickle.loads(pickle.dumps(change.splits))
        again = pa.concat_tables([s.to_arrow() for s in copies])
        assert sorted(again.to_pylist(), key=str) == sorted(change.to_arrow().to_pylist(),
                                                            key=str)


@pytest.mark.parametrize("table_kind", ["keyed", "plain"])
def test_four_shards_see_every_change_exactly_once(sqlite_lake, table_kind):
    if table_kind == "keyed":
        t = sqlite_lake.create_table("s.t", KEYED, primary_key=["k"], buckets=8)
    else:
        t = sqlite_lake.create_table("s.t", KEYED)
    for i in range(6):
        keys = list(range(i * 50, i * 50 + 50))
        t.append({"k": keys, "region": ["EU"] * 50, "amount": [i] * 50})
    t.delete(al.col("k").isin(list(range(0, 300, 7))))
    everything = [r for c in t.stream(start="earliest", include_row_kind=True,
                                      stop_at_latest=True) for r in c.to_arrow().to_pylist()]
    options = [{"shard": (i, 4)} for i in range(4)]
    options += [{"buckets": [0, 1, 2]}, {"bucket_filter": lambda b: b % 8 > 2}]
    seen: list[list[dict]] = []
    for opts in options:
        stream = t.stream(start="earliest", include_row_kind=True, stop_at_latest=True, **opts)
        seen.append([r for c in stream for r in c.to_arrow().to_pylist()])

    def key(r: dict) -> tuple:
        return (r["k"], r["_row_kind"], r["amount"])

    shards = sorted((r for part in seen[:4] for r in part), key=key)
    assert shards == sorted(everything, key=key)
    assert all(seen[:4])  # every shard got work
    if table_kind == "keyed":
        assert sorted(seen[4] + seen[5], key=key) == sorted(everything, key=key)
    with pytest.raises(ValidationError):
        t.stream(shard=(4, 4))
    with pytest.raises(ValidationError):
        t.stream(shard=(0, 2), buckets=[1])


def test_next_change_is_read_ahead_with_the_same_rows(sqlite_lake):
    t = sqlite_lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=2)
    for i in range(4):
        t.upsert({"k": [i, i + 10], "region": ["EU", "US"], "amount": [i, i]})
    t.delete("k = 11")

    def read(prefetch: bool) -> tuple[list, list[bool]]:
        out, ahead = [], []
        for change in t.stream(start="earliest", include_row_kind=True, stop_at_latest=True,
                               catch_up_threshold=None, prefetch=prefetch):
            ahead.append(change.prefetched is not None)
            out.append((change.snapshot_id, rows(change)))
        return out, ahead

    with_prefetch, ahead = read(True)
    without, none_ahead = read(False)
    assert with_prefetch == without
    assert ahead == [False, True, True, True, True]
    assert not any(none_ahead)


# -- issue 20 --------------------------------------------------------------------------------


def test_a04_a_stream_over_a_dropped_table_raises_table_not_found(sqlite_lake):
    t = sqlite_lake.create_table("s.t", PLAIN)
    t.append({"id": [1], "region": ["EU"]})
    stream = t.stream(consumer="etl", poll_interval=0.05)
    seen: list[object] = []

    def consume() -> None:
        try:
            for change in stream:
                seen.append(change.kind)
        except al.TableNotFound:
            seen.append("TableNotFound")

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    sqlite_lake.drop_table("s.t")
    reader.join(10)
    assert not reader.is_alive()
    assert seen == ["full", "TableNotFound"]
    stream.close()

    # Bound to the table, not its name: a table created since under the name is another one.
    t = sqlite_lake.create_table("s.t", PLAIN)
    t.append({"id": [1], "region": ["EU"]})
    stream = t.stream(start="latest")
    sqlite_lake.drop_table("s.t")
    again = sqlite_lake.create_table("s.t", PLAIN)
    again.append({"id": [2], "region": ["US"]})
    with pytest.raises(al.TableNotFound, match="dropped"):
        stream.poll()
    stream.close()


def _net_change_table(lake: al.Lake) -> tuple[al.Table, int]:
    t = lake.create_table("s.kv", KEYED, deletion_vectors=False, primary_key=["k"], buckets=2)
    t.upsert({"k": [1, 2, 3], "region": ["EU", "US", "EU"], "amount": [10, 20, 30]})
    start = t.current_snapshot_id
    t.upsert({"k": [1, 4], "region": ["EU", "US"], "amount": [11, 40]})
    t.delete("k = 2")
    return t, start


def test_a10_stream_columns_empty_gives_the_rows_with_no_columns(sqlite_lake):
    t = sqlite_lake.create_table("s.t", PLAIN)
    t.append({"id": [1, 2], "region": ["EU", "US"]})
    t.append({"id": [3], "region": ["EU"]})
    t.delete("id = 1")
    expected = t.scan(columns=[]).to_arrow()
    assert (expected.num_rows, expected.column_names) == (2, [])
    changes = list(t.stream(columns=[], start="earliest", stop_at_latest=True,
                            catch_up_threshold=None))
    tables = [c.to_arrow() for c in changes]
    assert [(x.num_rows, x.column_names) for x in tables] == [(2, []), (1, []), (1, [])]
    assert [sum(b.num_rows for b in c.to_batches()) for c in changes] == [2, 1, 1]
    kinds = [c.to_arrow() for c in t.stream(columns=[], include_row_kind=True,
                                            start="earliest", stop_at_latest=True,
                                            catch_up_threshold=None)]
    assert [x.to_pydict() for x in kinds] == [
        {"_row_kind": ["+I", "+I"]}, {"_row_kind": ["+I"]}, {"_row_kind": ["-D"]}]
    [full] = list(t.stream(columns=[], stop_at_latest=True))
    assert full.to_arrow().num_rows == 2
    appended = sqlite_lake.create_table("s.appended", PLAIN)
    for i in range(3):
        appended.append({"id": [i, i], "region": ["EU", "US"]})
    [caught_up] = list(appended.stream(columns=[], start="earliest", stop_at_latest=True,
                                       catch_up_threshold=1))
    assert caught_up.kind == "catch-up"
    assert caught_up.to_arrow().num_rows == 6

    # Primary-key tables: the changes as written, and the net change when catching up.
    kv, start = _net_change_table(sqlite_lake)
    per_snapshot = [c.to_arrow() for c in kv.stream(
        columns=[], include_row_kind=True, start=start + 1, stop_at_latest=True,
        catch_up_threshold=None)]
    assert [x.to_pydict() for x in per_snapshot] == [
        {"_row_kind": ["+I", "+I"]}, {"_row_kind": ["-D"]}]
    [net] = list(kv.stream(columns=[], include_row_kind=True, start=start + 1,
                           stop_at_latest=True, catch_up_threshold=1))
    assert sorted(net.to_arrow().column("_row_kind").to_pylist()) == ["+I", "+U", "-D"]
    [net] = list(kv.stream(columns=[], start=start + 1, stop_at_latest=True,
                           catch_up_threshold=1))
    assert (net.to_arrow().num_rows, net.to_arrow().column_names) == (3, [])


def test_a10_stream_columns_empty_on_a_lookup_changelog(sqlite_lake):
    t = sqlite_lake.create_table("s.kv", KEYED, primary_key=["k"], buckets=1,
                                 changelog_producer="lookup")
    t.upsert({"k": [1, 2], "region": ["EU", "US"], "amount": [10, 20]})
    start = t.current_snapshot_id
    t.upsert({"k": [1, 3], "region": ["EU", "EU"], "amount": [11, 30]})
    [change] = list(t.stream(columns=[], include_row_kind=True, start=start + 1,
                             stop_at_latest=True))
    assert sorted(change.to_arrow().column("_row_kind").to_pylist()) == ["+I", "+U", "-U"]
    [change] = list(t.stream(columns=[], start=start + 1, stop_at_latest=True))
    assert (change.to_arrow().num_rows, change.to_arrow().column_names) == (3, [])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e12, -1, True,
                                   "1"])
def test_a11_poll_interval_nan_infinite_or_unwaitable_is_refused(sqlite_lake, value):
    t = sqlite_lake.create_table("s.t", PLAIN)
    with pytest.raises(ValidationError, match="poll_interval must be a number of seconds"):
        t.stream(start="latest", poll_interval=value)
    for threshold in (True, 0, 1.5, float("nan")):
        with pytest.raises(ValidationError, match="catch_up_threshold"):
            t.stream(start="latest", catch_up_threshold=threshold)
    t.stream(start="latest", poll_interval=0).close()  # 0: poll without pause, as before


def test_18d_commit_past_what_the_stream_yielded_is_refused(sqlite_lake):
    t = sqlite_lake.create_table("s.t", PLAIN)
    for i in range(4):
        t.append({"id": [i], "region": ["EU"]})
    with t.stream(consumer="etl", start="earliest", catch_up_threshold=None) as stream:
        first = next(stream)
        assert first.snapshot_id == 1
        with pytest.raises(ValidationError, match="yielded changes up to snapshot 1"):
            stream.commit(3)
        stream.commit(first.snapshot_id)
    assert t.consumers().column("next_snapshot").to_pylist() == [2]
    # The restart resumes after what was committed: nothing is skipped.
    with t.stream(consumer="etl", stop_at_latest=True, catch_up_threshold=None) as stream:
        assert [c.snapshot_id for c in stream] == [2, 3, 4]
    # Before the first (full) change is yielded, there is nothing to commit.
    with t.stream(consumer="fresh") as stream:
        with pytest.raises(ValidationError, match="not yielded its first change"):
            stream.commit()
        assert next(stream).kind == "full"
        stream.commit()
    assert t.consumers().to_pydict()["next_snapshot"] == [2, 5]  # etl, fresh


def test_18c_a_commit_never_moves_a_consumers_progress_back(sqlite_lake):
    t = sqlite_lake.create_table("s.t", PLAIN)
    for i in range(4):
        t.append({"id": [i], "region": ["EU"]})
    with t.stream(consumer="etl", start="earliest", stop_at_latest=True,
                  catch_up_threshold=None) as stream:
        assert [c.snapshot_id for c in stream] == [1, 2, 3, 4]
        stream.commit(3)
        stream.commit(1)  # an older snapshot: changes nothing
    assert t.consumers().column("next_snapshot").to_pylist() == [4]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_18c_a_second_open_stream_of_a_consumer_id_is_refused(kind, tmp_path, request):
    t = make_lake(kind, tmp_path, request).create_table("s.t", PLAIN)
    t.append({"id": [1], "region": ["EU"]})
    first = t.stream(consumer="etl", start="earliest")
    with pytest.raises(ConsumerInUse, match="held by another open stream"):
        t.stream(consumer="etl")
    t.stream(consumer="other").close()  # other ids are free
    first.close()
    # Closed (or garbage-collected, or at the end of a stop_at_latest iteration): free again.
    second = t.stream(consumer="etl", start="earliest", stop_at_latest=True)
    assert [c.snapshot_id for c in second] == [1]
    third = t.stream(consumer="etl", start="earliest")
    with pytest.raises(ConsumerInUse, match="taken over by another stream"):
        second.commit(1)  # the id is the open stream's now
    del third
    second.commit(1)
    assert t.consumers().column("next_snapshot").to_pylist() == [2]
    second.close()
