"""Tables on S3 (moto): what the shared suite checks with os.path, plus S3-only behaviour.

The shared table suite (tests/test_lake.py, tests/table/, tests/scan/) also runs on S3 through
the ``lake`` fixture's "sqlite-s3" and "postgres-s3" kinds.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import SchemaMismatch
from arrowlake.io import prefetch
from arrowlake.io.object_store import ObjectStorage
from tests.conftest import ORDERS_SCHEMA, make_lake, orders_data, sorted_rows

pytestmark = pytest.mark.s3


@pytest.fixture(params=["sqlite-s3", "postgres-s3"])
def s3_lake(request, tmp_path):
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


@pytest.fixture
def s3_orders(s3_lake) -> al.Table:
    table = s3_lake.create_table("shop.orders", ORDERS_SCHEMA, partition_by=["day"])
    for start in (0, 10, 20):
        table.append(orders_data(start, 10))
    return table


def listed(table: al.Table) -> set[str]:
    return {f.path for f in table._storage.list_files(table.location)}


def test_files_live_in_the_bucket(s3_orders):
    assert s3_orders.location.startswith("s3://")
    paths = set(s3_orders.files().column("path").to_pylist())
    assert paths and paths <= listed(s3_orders)
    assert all("/data/day=2026-11-0" in p for p in paths)


def test_scan_with_pushdown_and_time_travel(s3_orders):
    got = s3_orders.scan(filter="day = '2026-11-02' and amount > 10", columns=["order_id"])
    expected = [r for r in orders_data(0, 30).to_pylist()
                if str(r["day"]) == "2026-11-02" and r["amount"] > 10]
    assert sorted(got.to_arrow().column("order_id").to_pylist()) == \
        sorted(r["order_id"] for r in expected)
    assert s3_orders.scan(snapshot=1).count() == 10
    assert sorted_rows(s3_orders.scan().to_arrow()) == sorted_rows(orders_data(0, 30))


def test_streaming_reads_prefetch_window_by_window(s3_orders, monkeypatch):
    monkeypatch.setattr(prefetch, "WINDOW_FILES", 2)
    batches = list(s3_orders.scan(columns=["order_id", "amount"]).to_batches())
    assert sum(b.num_rows for b in batches) == 30
    assert s3_orders.scan(limit=4).to_arrow().num_rows == 4
    assert s3_orders.scan(filter="order_id >= 25").count() == 5


def test_one_column_reads_fewer_bytes(s3_lake, monkeypatch):
    table = s3_lake.create_table("t.wide", pa.schema(
        [("id", pa.int64()), *[(f"c{i}", pa.float64()) for i in range(8)]]))
    n = 200_000
    rng = np.random.default_rng(7)  # random values: each column chunk is as big as the others
    table.append(pa.table({"id": pa.array(range(n), pa.int64()),
                           **{f"c{i}": pa.array(rng.random(n)) for i in range(8)}}))
    moved: list[int] = []
    original = ObjectStorage.read_range_async

    async def counting(self, path, start, end):  # type: ignore[no-untyped-def]
        data = await original(self, path, start, end)
        moved.append(len(data))
        return data

    monkeypatch.setattr(ObjectStorage, "read_range_async", counting)
    monkeypatch.setattr(prefetch, "COALESCE_BYTES", 4096)  # these chunks are small
    prefetch.FOOTERS.clear()
    assert table.scan().to_arrow().num_rows == n
    full = sum(moved)
    moved.clear()
    prefetch.FOOTERS.clear()
    assert table.scan(columns=["c3"]).to_arrow().num_rows == n
    assert sum(moved) < full / 4


def test_failed_write_leaves_table_and_bucket_as_they_were(s3_orders):
    before = listed(s3_orders)

    def stream():
        yield orders_data(100, 5).to_batches()[0]
        yield pa.record_batch({"order_id": ["oops"]})

    with pytest.raises(SchemaMismatch):
        s3_orders.append(stream())
    assert listed(s3_orders) == before
    assert s3_orders.count() == 30


def test_expire_snapshots_deletes_objects(s3_orders):
    s3_orders.delete("day = '2026-11-01'")
    old = set(s3_orders.files(snapshot=3).column("path").to_pylist())
    live = set(s3_orders.files().column("path").to_pylist())
    s3_orders.expire_snapshots(retain_last=1)
    remaining = listed(s3_orders)
    assert live <= remaining and not (old - live) & remaining
    assert s3_orders.count() == len([r for r in orders_data(0, 30).to_pylist()
                                     if str(r["day"]) != "2026-11-01"])


def test_remove_orphan_files(s3_orders):
    storage = s3_orders._storage
    stray = storage.join(s3_orders.location, "data", "stray.parquet")
    storage.write_bytes(stray, b"junk")
    assert s3_orders.remove_orphan_files().files == []  # younger than a day
    found = s3_orders.remove_orphan_files(older_than=timedelta(0))
    assert found.files == [stray] and stray in listed(s3_orders)
    s3_orders.remove_orphan_files(older_than=timedelta(0), dry_run=False)
    assert stray not in listed(s3_orders)
    assert s3_orders.count() == 30


def test_drop_table_purges_objects(s3_lake, s3_orders):
    assert listed(s3_orders)
    s3_lake.drop_table("shop.orders", purge=True)
    assert listed(s3_orders) == set()


def test_pickled_splits_read_in_another_process(s3_lake):
    """A process that unpickles splits (and imports nothing itself) reads them from S3, merged
    for a primary-key table, as this process does."""
    plain = s3_lake.create_table("shop.orders", ORDERS_SCHEMA, partition_by=["day"])
    plain.append(orders_data(0, 20))
    keyed = s3_lake.create_table("crm.users", pa.schema([("id", pa.int64()), ("v", pa.string())]),
                                 primary_key=["id"], buckets=2)
    keyed.upsert(pa.table({"id": [1, 2, 3, 4], "v": ["a", "b", "c", "d"]}))
    keyed.upsert(pa.table({"id": [2, 3], "v": ["B", "C"]}))
    keyed.delete("id = 4")
    reader = ("import pickle, sys\n"
              "import pyarrow as pa\n"
              "splits = pickle.load(sys.stdin.buffer)\n"
              "table = pa.concat_tables([s.to_arrow() for s in splits])\n"
              "with pa.ipc.new_stream(sys.stdout.buffer, table.schema) as out:\n"
              "    out.write_table(table)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for scan, key in ((plain.scan(filter="amount > 10"), "order_id"), (keyed.scan(), "id")):
        splits = scan.plan(target_bytes=1)
        assert splits
        done = subprocess.run([sys.executable, "-c", reader], input=pickle.dumps(splits),
                              capture_output=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        got = pa.ipc.open_stream(done.stdout).read_all()
        assert sorted_rows(got, key) == sorted_rows(scan.to_arrow(), key)
    assert sorted(keyed.to_arrow().column("v").to_pylist()) == ["B", "C", "a"]


def test_a_process_leaving_a_scan_unfinished_exits_cleanly(s3_lake):
    """A process that reads the first batch of a many-file split and exits, its read-ahead
    still queued, exits at once with status 0. Arrow's threads used to ask for the GIL after
    finalization began: the process then hung at exit or aborted ("terminate called without
    an active exception"), about one run in two."""
    plain = s3_lake.create_table("shop.orders", ORDERS_SCHEMA, partition_by=["day"])
    for start in range(0, 240, 20):
        plain.append(orders_data(start, 20))
    [split] = plain.scan().plan(target_bytes=1 << 40)
    assert len(split.files) > 10
    reader = ("import pickle, sys\n"
              "split = pickle.load(sys.stdin.buffer)\n"
              "batches = split.to_batches()\n"
              "print(next(batches).num_rows)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(4):
        try:
            done = subprocess.run([sys.executable, "-c", reader], input=pickle.dumps(split),
                                  capture_output=True, env=env, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the reading process hung at exit")
        assert done.returncode == 0, done.stderr.decode()
        assert int(done.stdout) > 0
