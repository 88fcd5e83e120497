"""PyTorch: datasets share splits out among DataLoader workers and distributed ranks."""

from __future__ import annotations

import pickle
import sys
import threading
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import arrowlake as al
from arrowlake.errors import MissingDependency, ValidationError
from arrowlake.torch import shared_tensors, to_tensors
from tests.engines.conftest import events_data, fill_append_table, fill_pk_table

WORKERS = 4
RANKS = 2


def _ids(dataset, workers: int = WORKERS) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # more workers than this machine's cores
        loader = DataLoader(dataset, batch_size=None, num_workers=workers)
        return np.concatenate([np.empty(0, np.int64)]
                              + [batch["id"].numpy() for batch in loader])


def _epoch(table: al.Table, epoch: int, seed: int) -> list[np.ndarray]:
    """The ids each simulated rank reads in ``epoch``, through a 4-worker DataLoader."""
    out = []
    for rank in range(RANKS):
        ds = table.scan(columns=["id", "x", "y"]).to_torch(
            batch_size=64, shuffle_buffer=300, seed=seed, rank=rank, world_size=RANKS,
            split_bytes=1)
        ds.set_epoch(epoch)
        out.append(_ids(ds))
    return out


def test_workers_and_ranks_read_every_row_once_per_epoch(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=12, rows=200)
    n = table.count()
    assert len(table.scan().plan(1)) >= RANKS * WORKERS
    orders = []
    for epoch in range(2):
        per_rank = _epoch(table, epoch, seed=11)
        everything = np.concatenate(per_rank)
        assert len(everything) == n  # every row once: no row twice, none missing
        assert np.array_equal(np.sort(everything), np.arange(n))
        assert not set(per_rank[0]) & set(per_rank[1])  # the ranks' shares are disjoint
        assert all(len(ids) > n // 4 for ids in per_rank)  # and both do real work
        orders.append(everything)
    assert not np.array_equal(orders[0], orders[1])  # a new shuffle every epoch
    assert not np.array_equal(orders[0], np.sort(orders[0]))
    # The same seed gives the same epochs, row for row; another seed another order.
    assert np.array_equal(np.concatenate(_epoch(table, 1, seed=11)), orders[1])
    assert not np.array_equal(np.concatenate(_epoch(table, 1, seed=12)), orders[1])


def test_a_dataset_used_in_one_process_reshuffles_every_epoch(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=6, rows=100)
    ds = table.scan(columns=["id"]).to_torch(batch_size=50, seed=3, split_bytes=1)
    first, second = _ids(ds, workers=0), _ids(ds, workers=0)
    assert sorted(first) == sorted(second) == list(range(table.count()))
    assert not np.array_equal(first, second)


def test_without_set_epoch_a_dataloader_still_reshuffles_every_epoch(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=6, rows=100)
    ds = table.scan(columns=["id"]).to_torch(batch_size=50, seed=3, split_bytes=1)
    torch.manual_seed(0)
    first, second = _ids(ds, workers=2), _ids(ds, workers=2)  # new worker processes each time
    assert sorted(first) == sorted(second) == list(range(table.count()))
    assert not np.array_equal(first, second)
    torch.manual_seed(0)  # the DataLoader's base seeds repeat, and with them the epochs
    assert np.array_equal(_ids(ds, workers=2), first)


def test_a_source_of_splits_as_they_come_is_shared_out_in_arrival_order(sqlite_lake):
    """What Stream.to_torch builds on: every reader keeps every n-th split that arrives."""
    table = fill_append_table(sqlite_lake, commits=9, rows=120)
    snapshots = table.snapshots()["snapshot_id"].to_pylist()

    def changes():  # the rows each commit added, split by split, like a stream's changes
        before: set[int] = set()
        for snapshot in snapshots:
            scan = table.scan(columns=["id"], snapshot=snapshot)
            for split in scan.plan(1):
                ids = frozenset(f.file_id for f in split.files)
                if not ids <= before:
                    before |= ids
                    yield split

    seen = []
    for rank in range(RANKS):
        ds = al.torch.dataset(changes, table.scan(columns=["id"]).schema, batch_size=32,
                              shuffle=False, rank=rank, world_size=RANKS, seed=1)
        seen.append(_ids(ds, workers=2))
    everything = np.concatenate(seen)
    assert np.array_equal(np.sort(everything), np.arange(table.count()))
    assert not set(seen[0]) & set(seen[1])



class _Part:
    """A split of ``rows`` ids from ``start`` in batches of 10, recording when it is opened."""

    def __init__(self, start: int, rows: int, log: list[str], fail: bool = False) -> None:
        self.start, self.rows, self.log, self.fail = start, rows, log, fail
        self.opened = threading.Event()

    @property
    def row_count(self) -> int:
        return self.rows

    def to_batches(self):
        self.log.append(f"open {self.start}")
        self.opened.set()
        if self.fail:
            raise OSError(f"split {self.start} cannot be read")
        for lo in range(self.start, self.start + self.rows, 10):
            yield pa.record_batch({"id": np.arange(lo, min(lo + 10, self.start + self.rows))})


def test_the_next_split_is_opened_while_one_is_handed_out_and_rows_keep_their_order():
    log: list[str] = []
    ahead = al.torch._AHEAD
    parts = [_Part(i * 30, 30, log) for i in range(ahead + 3)]
    reading = al.torch.SplitDataset(parts, pa.schema([("id", pa.int64())]), batch_size=10,
                                    shuffle=False, output="arrow")
    batches = reading.batches()
    assert next(batches)["id"].to_pylist() == list(range(10))
    for part in parts[1:ahead + 1]:  # opened ahead, before split 0 was handed out in full
        assert part.opened.wait(10)
    assert not parts[ahead + 1].opened.is_set()  # but no further
    rest = [b["id"].to_pylist() for b in batches]
    assert sum(rest, list(range(10))) == list(range(30 * len(parts)))
    assert sorted(log) == sorted(f"open {i * 30}" for i in range(len(parts)))


def test_a_split_that_fails_to_read_fails_after_the_rows_before_it():
    log: list[str] = []
    parts = [_Part(0, 30, log), _Part(30, 30, log, fail=True), _Part(60, 30, log)]
    reading = al.torch.SplitDataset(parts, pa.schema([("id", pa.int64())]), batch_size=10,
                                    shuffle=False, output="arrow")
    seen: list[int] = []
    with pytest.raises(OSError, match="split 30 cannot be read"):
        for batch in reading.batches():
            seen.extend(batch["id"].to_pylist())
    assert seen == list(range(30))


def test_a_source_is_not_asked_past_caught_up_before_the_rows_before_it_left():
    log: list[str] = []
    caught_up = al.torch.CAUGHT_UP

    def source():
        yield _Part(0, 25, log)
        log.append("caught up")
        yield caught_up
        log.append("asked again")  # a stream's source would wait here for new changes
        yield _Part(100, 5, log)

    reading = al.torch.SplitDataset(source, pa.schema([("id", pa.int64())]), batch_size=10,
                                    shuffle=False, output="arrow")
    out = []
    for batch in reading.batches():
        out.append(batch["id"].to_pylist())
        if len(out) == 3:  # the held rows leave at CAUGHT_UP: 10, 10, then the last 5
            assert "asked again" not in log
    assert out == [list(range(10)), list(range(10, 20)), list(range(20, 25)),
                   list(range(100, 105))]

def test_primary_key_tables_are_read_merged(sqlite_lake):
    table = fill_pk_table(sqlite_lake)
    expected = table.scan(columns=["id", "y"]).to_arrow().sort_by("id")
    ds = table.scan(columns=["id", "y"]).to_torch(batch_size=128, seed=1, split_bytes=1)
    rows = {}
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        rows.update(zip(batch["id"].tolist(), batch["y"].tolist(), strict=True))
    assert len(rows) == expected.num_rows
    assert rows == dict(zip(expected["id"].to_pylist(), expected["y"].to_pylist(), strict=True))


def test_batches_are_exact_and_drop_last_drops_the_short_one(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=3, rows=100)  # 100 + 101 + 102 rows
    full = table.scan(columns=["id"]).to_torch(batch_size=40, shuffle=False)
    sizes = [len(b["id"]) for b in full]
    assert sizes == [40] * 7 + [23]
    dropped = table.scan(columns=["id"]).to_torch(batch_size=40, drop_last=True, shuffle=False)
    assert [len(b["id"]) for b in dropped] == [40] * 7


def test_tensors_have_the_columns_types_and_share_arrows_memory(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=2, rows=100)
    ds = table.scan(columns=["id", "x", "y", "day"]).to_torch(batch_size=1000)
    (batch,) = list(ds)
    assert {k: v.dtype for k, v in batch.items()} == {
        "id": torch.int64, "x": torch.float32, "y": torch.int32, "day": torch.int32}
    assert np.array_equal(batch["x"].numpy(), (batch["id"].numpy() * 0.5).astype(np.float32))
    arrow = pa.record_batch({"v": pa.array(np.arange(10, dtype=np.float64))}).slice(3)
    tensor = to_tensors(arrow)["v"]
    assert tensor.tolist() == list(range(3, 10))
    assert tensor.data_ptr() == arrow.column(0).buffers()[1].address + 3 * 8  # no copy


def test_shared_tensors_equal_arrows_for_every_tensor_type_across_chunks():
    part = pa.table({
        "i": pa.array([1, 2, 3], pa.int16()), "f": pa.array([1.5, None, 2.0]),
        "b": [True, False, True], "t": pa.array([1, 2, 3], pa.timestamp("ms")),
        "e": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32(), 2)),
        "u": pa.array([7, 8, 9], pa.uint8())})
    table = pa.concat_tables([part, part.slice(1)])  # two chunks, the second one offset
    shared = shared_tensors(table)
    assert shared is not None  # Linux, torch's default sharing strategy
    expected = to_tensors(table.combine_chunks().to_batches()[0])
    assert list(shared) == list(expected)
    for name, tensor in shared.items():
        assert tensor.dtype == expected[name].dtype and tensor.shape == expected[name].shape
        assert torch.equal(tensor.nan_to_num(), expected[name].nan_to_num()), name
        assert tensor.untyped_storage().is_shared()  # sent to the main process as it is
    assert shared["f"][1].isnan() and shared["e"].tolist()[3] == [3.0, 4.0]


def test_workers_hand_over_tensors_in_shared_memory_with_the_right_rows(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=4, rows=100)
    ds = table.scan(columns=["id", "x", "day"]).to_torch(batch_size=70, seed=1, split_bytes=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert all(b["id"].untyped_storage().is_shared() for b in batches)
    ids = torch.cat([b["id"] for b in batches]).numpy()
    order = np.argsort(ids)
    arrow = table.scan(columns=["id", "x", "day"]).to_arrow().sort_by("id")
    assert np.array_equal(ids[order], arrow["id"].to_numpy())
    assert np.array_equal(torch.cat([b["x"] for b in batches]).numpy()[order],
                          arrow["x"].to_numpy())
    assert np.array_equal(torch.cat([b["day"] for b in batches]).numpy()[order],
                          arrow["day"].cast(pa.int32()).to_numpy())


def test_arrow_output_yields_record_batches_with_any_column(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=2, rows=100)
    ds = table.scan(columns=["id", "customer"]).to_torch(batch_size=150, output="arrow",
                                                         shuffle_buffer=80, seed=5)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    rows = pa.Table.from_batches(batches).sort_by("id")
    assert rows.equals(table.scan(columns=["id", "customer"]).to_arrow().sort_by("id"))


def test_columns_without_a_tensor_form_are_refused_up_front(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=1)
    with pytest.raises(ValidationError, match=r"customer \(string\).*output='arrow'"):
        table.scan().to_torch()
    with pytest.raises(ValidationError, match="seed="):
        table.scan(columns=["id"]).to_torch(rank=0, world_size=2)


@pytest.mark.parametrize(("option", "value"), [
    ("batch_size", float("nan")), ("batch_size", 1.5), ("batch_size", True),
    ("shuffle_buffer", float("nan")), ("rank", 0.5)])
def test_a11_numeric_dataset_options_must_be_whole_numbers(sqlite_lake, option, value):
    table = fill_append_table(sqlite_lake, commits=1)
    options = {"rank": 0, "world_size": 1, option: value}
    with pytest.raises(ValidationError, match=option):
        table.scan(columns=["id"]).to_torch(**options)
    with table.stream(columns=["id"]) as stream, pytest.raises(ValidationError, match=option):
        stream.to_torch(**options)


def test_datasets_pickle_for_spawned_workers(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=2, rows=50)
    ds = table.scan(columns=["id"]).to_torch(batch_size=1000, seed=2)
    copy = pickle.loads(pickle.dumps(ds))
    assert isinstance(copy, torch.utils.data.IterableDataset)
    assert sorted(next(iter(copy))["id"].tolist()) == list(range(101))


def test_to_torch_without_torch_names_the_extra(sqlite_lake, monkeypatch):
    table = fill_append_table(sqlite_lake, commits=1)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(MissingDependency, match=r"arrowlake\[torch\]"):
        table.scan(columns=["id"]).to_torch()


# -- streams --------------------------------------------------------------------------------------


def test_a_stream_to_the_latest_snapshot_gives_every_row_once(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=9, rows=50)  # 9 changes, one split each
    stream_opts = {"start": "earliest", "stop_at_latest": True, "columns": ["id", "y"]}
    seen = []
    for rank in range(RANKS):
        stream = table.stream(**stream_opts)
        ds = stream.to_torch(batch_size=40, rank=rank, world_size=RANKS, seed=4)
        seen.append(_ids(ds, workers=2))
    everything = np.concatenate(seen)
    assert np.array_equal(np.sort(everything), np.arange(table.count()))
    assert all(len(ids) for ids in seen)


def test_a_live_stream_follows_the_table_as_it_grows(sqlite_lake):
    table = fill_append_table(sqlite_lake, commits=2, rows=100)
    start = table.count()
    stream = table.stream(start="latest", poll_interval=0.05, columns=["id", "x"])
    ds = stream.to_torch(batch_size=25)
    # in_order=False: a worker with rows need not wait for one whose share has not come yet.
    loader = DataLoader(ds, batch_size=None, num_workers=2, in_order=False, timeout=60)
    added = 5 * 60

    def grow() -> None:
        for i in range(5):
            time.sleep(0.1)
            table.append(events_data(start + i * 60, 60))

    writer = threading.Thread(target=grow)
    writer.start()
    seen: list[int] = []
    for batch in loader:  # never ends by itself: stop once every added row arrived
        seen.extend(batch["id"].tolist())
        if len(seen) >= added:
            ds.close()  # the workers stop following the stream, and the loop ends
    writer.join()
    assert sorted(seen) == list(range(start, start + added))  # only new rows, each once
    stream.close()


ID_ONLY = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def _follow(ds, into: list[int]) -> None:
    for batch in ds:
        into.extend(batch.column("id").to_pylist())


def test_a08_stream_readers_that_catch_up_differently_read_every_row_once(sqlite_lake):
    # Rank 0 polls with 3 commits queued and follows the next 12 one by one; rank 1 first
    # polls 15 commits behind (past catch_up_threshold): both must cut the history alike.
    table = sqlite_lake.create_table("s.ids", ID_ONLY)
    table.append({"id": [-1]})
    start = table.current_snapshot_id + 1
    for i in range(3):
        table.append({"id": [i]})
    got: list[list[int]] = [[], []]
    datasets = [table.stream(start=start, poll_interval=0.02).to_torch(
        batch_size=100, rank=rank, world_size=2, output="arrow") for rank in range(2)]
    first = threading.Thread(target=_follow, args=(datasets[0], got[0]))
    first.start()
    for i in range(3, 15):
        table.append({"id": [i]})
        time.sleep(0.02)
    second = threading.Thread(target=_follow, args=(datasets[1], got[1]))
    second.start()
    deadline = time.monotonic() + 30
    while len(got[0]) + len(got[1]) < 15 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # (time for a row read twice to arrive)
    for ds in datasets:
        ds.close()
    first.join(10)
    second.join(10)
    assert sorted(got[0] + got[1]) == list(range(15))
    assert got[0] and got[1]


WRITER = r"""
import sys, time, pyarrow as pa, arrowlake as al
table = al.connect(sys.argv[1]).table("s.ids")
for i in range(int(sys.argv[2])):
    table.append({"id": pa.array(range(i * 3, i * 3 + 3), pa.int64())})
    time.sleep(0.002)
"""


def test_a08_two_dataloader_workers_with_a_writer_process_read_every_row_once(tmp_path):
    import subprocess
    from pathlib import Path

    lake = al.connect(tmp_path / "lake")
    table = lake.create_table("s.ids", ID_ONLY)
    commits = 80
    # Copies that poll at different moments find different numbers of commits queued: with
    # catch-up, they would cut the same history into different changes.
    stream = table.stream(start="latest", poll_interval=0.02, columns=["id"],
                          catch_up_threshold=2)
    ds = stream.to_torch(batch_size=64, output="arrow")
    src = str(Path(__file__).resolve().parents[2] / "src")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "lake"), str(commits)],
        env={**__import__("os").environ, "PYTHONPATH": src})
    # in_order=False: a worker with rows need not wait for one whose share has not come yet.
    loader = DataLoader(ds, batch_size=None, num_workers=2, in_order=False, timeout=60)
    seen: list[int] = []

    def stop() -> None:  # the loader never ends by itself: stop once the writer's rows came
        writer.wait(60)
        deadline = time.monotonic() + 30
        while len(seen) < 3 * commits and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # (time for a row read twice to arrive)
        ds.close()

    stopper = threading.Thread(target=stop)
    stopper.start()
    for batch in loader:
        seen.extend(batch.column("id").to_pylist())
    stopper.join()
    assert writer.wait(60) == 0
    assert sorted(seen) == list(range(3 * commits))  # every row once
    stream.close()
    lake.close()


# -- threads end (issue 31, item 5) ---------------------------------------------------------------

#: Two rank datasets over one table, each followed by a thread of its own, created while the
#: table grows (the repro a08 of issue 31): the main thread waits until every row arrived and
#: ends without closing them. The process must exit: at interpreter exit every stream dataset
#: stops following its stream, so the threads following them end.
RANK_READERS = r"""
import sys, threading, time, pyarrow as pa, arrowlake as al
lake = al.connect(sys.argv[1])
t = lake.create_table("s.t", pa.schema([pa.field("id", pa.int64(), nullable=False)]))
t.append({"id": [-1]}); start = t.current_snapshot_id + 1
for i in range(3): t.append({"id": [i]})
got = {0: [], 1: []}
def reader(rank):
    ds = t.stream(start=start, poll_interval=0.05).to_torch(
        batch_size=100, rank=rank, world_size=2, output="arrow")
    for b in ds: got[rank] += b.column("id").to_pylist()
threading.Thread(target=reader, args=(0,)).start(); time.sleep(0.3)
for i in range(3, 15): t.append({"id": [i]})
threading.Thread(target=reader, args=(1,)).start()
deadline = time.monotonic() + 60
while len(got[0]) + len(got[1]) < 15 and time.monotonic() < deadline: time.sleep(0.05)
time.sleep(0.2)  # (time for a row read twice to arrive)
print(sorted(got[0] + got[1]), flush=True)
"""


def test_a_process_whose_stream_datasets_are_still_followed_exits(tmp_path):
    import subprocess
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    run = subprocess.run([sys.executable, "-c", RANK_READERS, str(tmp_path / "lake")],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": src})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == str(list(range(15)))  # every row once, then the exit


#: Threads a stream or its dataset starts: the read-ahead of a stream, the split readers of a
#: dataset, the commit watcher (SQLite) or listener (PostgreSQL) of the metastore.
STREAM_THREADS = ("arrowlake-stream", "arrowlake-torch", "arrowlake-watch", "arrowlake-listen")


def _stream_threads(before: set[threading.Thread]) -> list[str]:
    """Names of the threads started since ``before`` by a stream, once they had 5 s to end."""
    deadline = time.monotonic() + 5
    while True:
        left = [t.name for t in threading.enumerate()
                if t not in before and t.name.startswith(STREAM_THREADS)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


@pytest.mark.parametrize("close", ["dataset", "stream"])
def test_after_close_no_thread_a_stream_started_is_alive(sqlite_lake, close):
    table = sqlite_lake.create_table("s.ids", ID_ONLY)
    table.append({"id": [-1]})
    before = set(threading.enumerate())
    ranks = 2 if close == "dataset" else 1
    streams = [table.stream(start="earliest", poll_interval=0.02, columns=["id"])
               for _ in range(ranks)]
    for i in range(4):  # queued snapshots: a stream reads the next one ahead on a thread
        table.append({"id": [i]})
    for stream in streams:
        assert stream.poll() is not None
    datasets = [stream.to_torch(batch_size=100, rank=rank, world_size=ranks, output="arrow")
                for rank, stream in enumerate(streams)]
    got: list[int] = []
    readers = [threading.Thread(target=_follow, args=(ds, got)) for ds in datasets]
    for reader in readers:
        reader.start()
    table.append({"id": [4]})
    deadline = time.monotonic() + 30
    while 4 not in got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [t.name for t in threading.enumerate() if t not in before
            and t.name.startswith(STREAM_THREADS)]  # (the test sees them while they run)
    if close == "dataset":
        for ds in datasets:
            ds.close()
        assert all(stream.closed for stream in streams)  # a dataset's close closes its stream
    else:
        streams[0].close()  # the dataset following it ends too
    for reader in readers:
        reader.join(10)
    assert not any(reader.is_alive() for reader in readers)
    assert _stream_threads(before) == []
    assert 4 in got
