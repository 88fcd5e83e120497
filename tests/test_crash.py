"""A writer killed mid-write or mid-commit leaves the table readable at its last snapshot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pyarrow as pa
import pytest

from tests.conftest import make_lake

MID_WRITE = r"""
import sys, time, pyarrow as pa, arrowlake as al
uri, warehouse, marker = sys.argv[1], sys.argv[2], sys.argv[3]
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)
table = lake.table("c.crash")
def batches():
    for i in range(1000):
        yield pa.record_batch({"k": pa.array(range(i * 1000, i * 1000 + 1000), pa.int64())})
        if i == 20:
            open(marker, "w").close()
            time.sleep(120)
table.append(batches())
"""

MID_COMMIT = r"""
import sys, time, pyarrow as pa, arrowlake as al
from arrowlake.metastore import store
uri, warehouse, marker = sys.argv[1], sys.argv[2], sys.argv[3]
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)
table = lake.table("c.crash")
original = store.Metastore._commit_once
def stalled(self, conn, *args, **kwargs):
    result = original(self, conn, *args, **kwargs)  # rows inserted, transaction still open
    open(marker, "w").close()
    time.sleep(120)
    return result
store.Metastore._commit_once = stalled
table.append(pa.table({"k": pa.array(range(5000), pa.int64())}))
"""


def _uri(kind, lake, tmp_path):
    if kind == "sqlite":
        return str(tmp_path / "lake"), ""
    return lake.metastore.engine.url.render_as_string(hide_password=False), lake.warehouse


def _run_and_kill(script, uri, warehouse, marker):
    proc = subprocess.Popen([sys.executable, "-c", script, uri, warehouse, str(marker)])
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None, "the writer ended before reaching the crash point"
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("script", [MID_WRITE, MID_COMMIT], ids=["mid-write", "mid-commit"])
def test_killed_writer(kind, script, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    table = lake.create_table("c.crash", pa.schema([("k", pa.int64())]),
                              properties={"write.row-group-rows": 2000,
                                          "write.target-file-size": 8000})
    table.append(pa.table({"k": pa.array([-1, -2], pa.int64())}))
    before = table.files()["path"].to_pylist()
    uri, warehouse = _uri(kind, lake, tmp_path)
    _run_and_kill(script, uri, warehouse, tmp_path / "marker")

    # Last snapshot intact and readable; nothing of the killed write is visible.
    table.refresh()
    assert table.current_snapshot_id == 1
    assert sorted(table.to_arrow()["k"].to_pylist()) == [-2, -1]
    assert table.files()["path"].to_pylist() == before
    # The killed writer's files are left behind, and the orphan check finds exactly them.
    orphans = table.remove_orphan_files(older_than=timedelta(0))
    assert orphans.dry_run and orphans.files
    assert not set(orphans.files) & set(before)
    assert all(p.endswith(".parquet") for p in orphans.files)
    table.remove_orphan_files(older_than=timedelta(0), dry_run=False)
    assert table.remove_orphan_files(older_than=timedelta(0)).files == []
    # And the table takes new writes normally.
    table.append(pa.table({"k": pa.array([7], pa.int64())}))
    assert table.count() == 3
    lake.close()


IN_TRANSACTION = r"""
import sys, time, pyarrow as pa, arrowlake as al
from arrowlake.metastore import store
uri, warehouse, marker, point = sys.argv[1:5]
lake = al.connect(uri, warehouse=warehouse) if "://" in uri else al.connect(uri)

def crash_point():
    open(marker, "w").close()
    time.sleep(120)

def rows():
    for i in range(10):
        yield pa.record_batch({"k": pa.array(range(i * 100, i * 100 + 100), pa.int64())})
        if point == "writing" and i == 5:
            crash_point()

if point == "in-commit":
    original = store.Metastore._commit_once
    def stalled(self, conn, *args, **kwargs):
        result = original(self, conn, *args, **kwargs)  # one table's rows in, not committed
        crash_point()
    store.Metastore._commit_once = stalled

with lake.transaction() as tx:
    tx.table("c.plain").append(pa.RecordBatchReader.from_batches(
        pa.schema([("k", pa.int64())]), rows()))
    if point == "planning":
        crash_point()
    tx.table("c.keyed").upsert(pa.table({"k": pa.array(range(500), pa.int64())}))
if point == "after-commit":
    crash_point()
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("point", ["writing", "planning", "in-commit", "after-commit"])
def test_killed_transaction_leaves_all_or_nothing(kind, point, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    schema = pa.schema([("k", pa.int64())])
    plain = lake.create_table("c.plain", schema, properties={"write.row-group-rows": 100,
                                                             "write.target-file-size": 1})
    keyed = lake.create_table("c.keyed", schema, primary_key=["k"], buckets=2)
    plain.append(pa.table({"k": pa.array([-1], pa.int64())}))
    keyed.upsert(pa.table({"k": pa.array([-1], pa.int64())}))
    uri, warehouse = _uri(kind, lake, tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", IN_TRANSACTION, uri, warehouse,
                             str(tmp_path / "marker"), point])
    deadline = time.time() + 120
    while not (tmp_path / "marker").exists():
        assert proc.poll() is None, "the transaction ended before reaching the crash point"
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    landed = point == "after-commit"
    for table, rows in ((plain, 1001 if landed else 1), (keyed, 501 if landed else 1)):
        table.refresh()
        assert table.current_snapshot_id == (2 if landed else 1)
        assert table.count() == rows
    ids = {t.snapshots().column("transaction_id").to_pylist()[-1] for t in (plain, keyed)}
    assert (len(ids) == 1 and None not in ids) if landed else ids == {None}
    # The dead transaction's registration is revoked and its files are orphans.
    for table in (plain, keyed):
        table.remove_orphan_files(older_than=timedelta(hours=1), dry_run=False)
        leftover = table.remove_orphan_files(older_than=timedelta(0))  # (warns: age 0)
        assert all(p.endswith((".parquet", ".puffin")) for p in leftover.files)
    assert lake.metastore.revoke_dead_writes() == [] and lake.metastore.live_writes() == []
    lake.close()
